"""Sessions to a file and back: ``recorder.Recorder`` records a pipeline through
``writer.RecordWriter``, ``reader.Reader`` reads a recording by time (for ``report`` and the
replay), ``replay.ReplaySource`` plays a recording back as a session's source; ``schema``
describes the format."""
