"""The response cache: a request answered from it never reaches a GPU.

Two tiers over one store (DESIGN.md, "the request's path"):
- `exact`: the canonical request's hash (keys.py): same model, messages or prompt and every
  parameter that can change the answer;
- `semantic`: the nearest earlier question by an embedder's cosine similarity (embed.py,
  vectors.py), among the entries that share everything but the question.

Modules: keys.py and embed.py and answer.py are pure (what is cacheable, its key, its vector, the
answer and its replay); store.py (MemoryStore) and redis_store.py (RedisStore, shared by every
replica) keep entries; cache.py (`ResponseCache`) runs the tiers and fails open; http.py is the
handler's side (lookup, replay, `Cache-Control`); setup.py builds it from `CacheSettings`; admin.py
is `kvgate cache`.
"""
