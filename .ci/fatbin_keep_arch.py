"""Zero every device-code image but one architecture's in a CUDA shared library.

NCCL's wheel carries cubins for eight GPU generations (~340 MB); the GPU machine runs one. The
CUDA driver picks its image by the entry headers, which stay as they are, so zeroing the other
payloads keeps the library loadable there while it compresses to a tenth (one carry: see
.ci/nccl_parts).
Layout: fatbin header {magic 0xBA55ED50, u16 version, u16 header size, u64 entries' size}, then
entries {u16 kind (1 PTX, 2 ELF), u16, u32 header size, u64 payload size, ..., u32 arch at +28}.
    python3 .ci/fatbin_keep_arch.py LIB ARCH   (rewrites LIB in place; prints what it kept)
"""

import struct
import subprocess
import sys

MAGIC = 0xBA55ED50


def fatbin_sections(path):
    listing = ["readelf", "-S", "-W", path]
    out = subprocess.run(listing, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[1] in (".nv_fatbin", "__nv_relfatbin"):
            yield int(fields[4], 16), int(fields[5], 16)


def keep_arch(data: bytearray, start: int, size: int, arch: int) -> tuple[int, int]:
    kept = zeroed = 0
    pos, end = start, start + size
    while pos + 16 <= end:
        magic, _, header, entries = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:  # fatbins are 8-byte aligned within the section
            pos += 8
            continue
        entry, last = pos + header, pos + header + entries
        while entry < last:
            _, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            body = entry + entry_header
            if struct.unpack_from("<I", data, entry + 28)[0] == arch:
                kept += payload
            else:
                data[body : body + payload] = bytes(payload)
                zeroed += payload
            entry = body + payload
        pos = last
    return kept, zeroed


def main(path: str, arch: int) -> None:
    data = bytearray(open(path, "rb").read())
    kept = zeroed = 0
    for start, size in fatbin_sections(path):
        k, z = keep_arch(data, start, size, arch)
        kept, zeroed = kept + k, zeroed + z
    if not kept:
        sys.exit(f"{path}: no device code for sm_{arch}; nothing changed")
    open(path, "wb").write(data)
    print(f"{path}: kept {kept >> 20} MiB of sm_{arch} device code, zeroed {zeroed >> 20} MiB")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
