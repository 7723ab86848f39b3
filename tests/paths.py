"""Where the tests find their data files."""

from pathlib import Path

# Real-format payloads of vLLM, SGLang, TGI and llama.cpp (see fixtures/README.md); a copy of the
# project's shared fixtures, kept in the repository so the suite needs nothing beside the clone.
FIXTURES = Path(__file__).resolve().parent / "fixtures"
