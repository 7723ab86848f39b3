"""The response cache: a request answered from it never reaches a GPU.

Two tiers over one store:
- `exact`: the canonical request's hash (keys.py): same model, messages or prompt and every
  parameter that can change the answer;
- `semantic` (off unless `cache.semantic` says on or shadow): the nearest earlier question by an
  embedder's cosine similarity (embedders/, vectors.py; index.py for sparse vectors,
  dense_index.py for dense ones, vector_index.py choosing), among the entries that share
  everything but the question, each candidate vetted by the near-miss guard (guard.py,
  semantic.py); shadow mode records would-be hits instead of serving them (shadow.py,
  shadow_cli.py: `kvgate cache shadow-report`).
Identical requests in flight ask a backend once: a whole answer waits for the first one's, a
stream follows it live (live.py).

Modules: keys.py, embed.py, vectors.py, index.py and answer.py are pure (what is cacheable, its
key, its vector, the search, the answer and its replay); store.py (MemoryStore) and
redis_store.py (RedisStore, shared by every replica) keep entries; cache.py (`ResponseCache`)
runs the tiers, leads identical requests and fails open; tap.py stores a miss's answer;
live.py is a stream being followed;
http.py is the completion path's side (lookup, replay, following, `Cache-Control`,
/admin/cache); setup.py builds it from `CacheSettings`; admin.py is `kvgate cache`.
"""
