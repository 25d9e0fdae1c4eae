"""`atomdata-rs verify`: placeholder, being written."""


def main() -> int:
    return 0
