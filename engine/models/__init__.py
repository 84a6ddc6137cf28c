"""Whisper models: the local store of named and converted models (store), the download catalog and its
downloads (catalog, download), and the converters between formats (convert, importers, export_ggml)."""
