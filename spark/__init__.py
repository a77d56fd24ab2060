"""Redelivery-storm analysis of the delivery event log on Spark: `python spark/storms.py --help`."""
