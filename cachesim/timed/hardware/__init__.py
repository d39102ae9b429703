"""Hardware presets (JSON) for the timed storage-tier model; see `cachesim.timed.spec`."""
