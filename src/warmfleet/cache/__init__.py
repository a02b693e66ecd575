"""Pure cache planning: manifests, content keys, capacity admission, refcounts/pins, LRU."""
