"""kdnas.export"""
