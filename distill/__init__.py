"""kdnas.distill"""
