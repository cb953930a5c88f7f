"""kdnas.nas"""
