"""The platform: settings, the `gpuslice` command, metrics and monitoring config."""
