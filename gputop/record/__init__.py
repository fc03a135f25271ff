"""Sessions to a file and back: ``writer.Recorder`` records a pipeline, ``reader.Reader`` reads a
recording by time (for ``sources.replay`` and ``report``); ``schema`` describes the format."""
