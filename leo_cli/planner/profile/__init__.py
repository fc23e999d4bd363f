"""The hardware profile: the probe's ranks and measurements, the profile file, rate lookups,
the machine's load while probing, and the store of profiles kept between runs."""
