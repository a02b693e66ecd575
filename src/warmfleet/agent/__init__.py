"""Node agent I/O shell: sources, downloader, store, OCI client, status API, metrics."""
