"""Context parallelism on a device mesh: every sample's sequence split over the mesh's cp ranks
for the whole model (split.py), attention run as a ring over them (ring.py), its exchanges timed
and counted (probe.py) and predicted (traffic.py)."""
