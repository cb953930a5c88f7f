"""kdnas.latency"""
