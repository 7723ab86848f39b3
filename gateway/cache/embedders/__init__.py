"""Embedders: texts to vectors, behind one protocol (`base.Embedder`).

- `hashing`: the built-in hashed lexical features (sparse), good at surface variants;
- `local`: all-MiniLM-L6-v2 (int8 ONNX) run on onnxruntime in a worker thread (dense, 384);
- `remote`: an OpenAI-compatible `/v1/embeddings` endpoint (dense), failing open;
- `choice`: which one `cache.embedder` names (`auto`: local when installed, else hashing).

Importing this package imports no numpy, onnxruntime or tokenizers: only `local`, `remote` and
`batching` need the `kvgate[semantic]` extra, and only when they are imported.
"""
