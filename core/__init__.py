"""kdnas's shared basics, the bottom floor every other package may import (and which imports none):

    core.errors   KdnasError and its subclasses, first_line
    core.spec     StudentSpec, parse_arch, build_student: student shapes
    core.assets   the bundled teachers and corpus (pinned packages, verified hashes), cache_root
    core.files    atomic writes, files as readable as any the user makes (not private like temp files),
                  a writability check for output folders
    core.sentence the sentence-transformers files that make a student folder a drop-in for its teacher

Import the module you need (`from core.errors import KdnasError`); this file imports nothing, so
importing one basic does not load the others.
"""
