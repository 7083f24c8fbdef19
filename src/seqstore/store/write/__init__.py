"""Writing stores: shards built locally, committed through a commit target (target.py); docs/architecture.md
("``store/write/``: building shards and committing them") says which module holds what."""
