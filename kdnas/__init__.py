"""The `kdnas` command line, the top floor: it assembles the sub-commands of `distill`, `evaluation`,
`export`, `latency` and `nas` (see kdnas.cli). The Python API lives in those packages."""
