"""What a step costs: compiled for its mesh or for the chips it will run on
(a TPU topology through the TPU compiler, a GPU model through the chip
table), its FLOPs, memory and collectives per device, loops counted per
trip, and the estimate of how long a step takes."""
