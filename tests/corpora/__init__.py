"""Program corpora: the model zoo, ExportDB, OpInfo, the op corpus, transformers and real models."""
