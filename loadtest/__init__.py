"""Load tests, benchmarks and the backend simulator that powers `kvgate sim` and `kvgate demo`."""
