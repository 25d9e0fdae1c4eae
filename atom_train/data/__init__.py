"""The data layer: the Rust loader's Python face (ByteCorpus, BatchedByteStream), the
Atomizer oracle, what counts as text, and the loader's parity check (`atomdata-rs verify`).
"""
