#!/usr/bin/env python3
"""Writes the seed corpus of the fuzzers (tests/fuzz/corpus/<fuzzer>/), deterministically.

Each seed follows the input layout its fuzzer's source describes; the sparse buffers follow
docs/formats.md. Run from anywhere: python3 tests/fuzz/make_corpus.py
"""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

BF16_ONE, BF16_HALF, BF16_NEG2 = 0x3F80, 0x3F00, 0xC000


def align(x):
    return (x + 255) // 256 * 256


def write(fuzzer, name, data):
    d = os.path.join(CORPUS, fuzzer)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


# ---- fuzz_sparse_raw: head, rows, cols (u16), params[, backup], buffer --------------------------

def twell_params(tile, comp):
    """The params byte choosing tile width and compression (64 << p % 3, 2 << p / 3 % 3)."""
    return {64: 0, 128: 1, 256: 2}[tile] + 3 * {2: 0, 4: 1, 8: 2}[comp]


def twell_buffer(rows, cols, tile, comp, row_entries, overflow_rows=()):
    """row_entries[r]: {tile: [(col, bits), ...]}; a tile listed in overflow gets bit 31."""
    w = tile // comp
    nt = (cols + tile - 1) // tile
    ld = nt * w
    words = [0] * (rows * ld + 1 + rows)
    for r, tiles in enumerate(row_entries):
        for t, entries in tiles.items():
            base = r * ld + t * w
            over = r in overflow_rows and len(entries) == w - 1
            words[base] = len(entries) | (0x80000000 if over else 0)
            for i, (c, b) in enumerate(entries):
                words[base + 1 + i] = c | (b << 16)
    words[rows * ld] = len(overflow_rows)
    for i, r in enumerate(overflow_rows):
        words[rows * ld + 1 + i] = r
    return struct.pack("<%dI" % len(words), *words)


def hybrid_buffer(rows, cols, e, b, vsize, rows_data):
    """rows_data[r]: list of (col, bits); rows longer than e go to backup slots in order."""
    row_nnz = 0
    ell_cols = align(row_nnz + 4 * rows)
    ell_vals = align(ell_cols + 2 * rows * e)
    backup_count = align(ell_vals + vsize * rows * e)
    backup_ids = align(backup_count + 4)
    backup_map = align(backup_ids + 4 * b)
    backup_vals = align(backup_map + 4 * rows)
    total = align(backup_vals + vsize * b * cols)
    buf = bytearray(total)
    fmt = "<H" if vsize == 2 else "<I"
    slot = 0
    for r, entries in enumerate(rows_data):
        struct.pack_into("<i", buf, row_nnz + 4 * r, len(entries))
        struct.pack_into("<i", buf, backup_map + 4 * r, -1)
        if len(entries) <= e:
            for i, (c, v) in enumerate(entries):
                struct.pack_into("<H", buf, ell_cols + 2 * (r * e + i), c)
                struct.pack_into(fmt, buf, ell_vals + vsize * (r * e + i), v)
        else:
            if slot < b:
                struct.pack_into("<i", buf, backup_map + 4 * r, slot)
                struct.pack_into("<i", buf, backup_ids + 4 * slot, r)
                for c, v in entries:
                    struct.pack_into(fmt, buf, backup_vals + vsize * (slot * cols + c), v)
            slot += 1
    struct.pack_into("<i", buf, backup_count, slot)
    return bytes(buf)


def raw_seeds():
    f = "fuzz_sparse_raw"
    # an empty TwELL (the zero fill makes it valid)
    write(f, "twell-empty", [0x00, 2, 100, 0, twell_params(64, 8)])
    # a TwELL with entries in two tiles (bf16)
    rows = [{0: [(3, BF16_ONE), (60, BF16_HALF)], 1: [(64, BF16_NEG2)]}, {1: [(99, BF16_ONE)]}]
    write(f, "twell-entries", [0x00, 2, 100, 0, twell_params(64, 8)] + list(twell_buffer(2, 100, 64, 8, rows)))
    # an incomplete TwELL: one tile over capacity (7 slots), listed in the overflow record
    full = [(c, BF16_ONE) for c in range(7)]
    write(f, "twell-overflow", [0x00, 1, 64, 0, twell_params(64, 8)] + list(twell_buffer(1, 64, 64, 8, [{0: full}], (0,))))
    # a fp16 hybrid (E = 8, B = 1): a sparse row and a dense row in the backup slot
    dense_row = [(c, 0x3C00) for c in range(10)]
    head = 0x01 | (1 << 1)  # hybrid, fp16
    write(f, "hybrid-backup", [head, 2, 12, 0, 0, 1] + list(hybrid_buffer(2, 12, 8, 1, 2, [[(5, 0x3C00)], dense_row])))
    # an fp32 hybrid past its backup capacity (B = 0): incomplete
    head = 0x01 | (2 << 1)
    write(f, "hybrid-f32-incomplete",
          [head, 1, 12, 0, 0, 0] + list(hybrid_buffer(1, 12, 8, 0, 4, [[(c, 0x3F800000) for c in range(9)]])))


# ---- fuzz_sparse_mutated: head, rows-1, cols-1 (u16), params, backup, density, values, changes --

def mutated_seeds():
    f = "fuzz_sparse_mutated"
    rng = random.Random(7)
    def seed(name, head, rows, cols, params, backup, density, changes):
        vals = [rng.randrange(256) for _ in range(rows * cols)]
        write(f, name, [head, rows - 1, (cols - 1) & 0xFF, (cols - 1) >> 8, params, backup, density] + vals + changes)
    seed("twell-plain", 0x00, 4, 100, twell_params(64, 4), 0, 232, [0])
    seed("twell-relu-dense", 0x08, 3, 70, twell_params(64, 8), 0, 0, [0])  # tiles overflow
    seed("hybrid-f32", 0x01 | (2 << 1), 5, 40, 1, 2, 210, [0])
    # a fp16 hybrid with three changes: a byte xor, a word set to -1, a column near cols
    seed("hybrid-f16-changed", 0x01 | (1 << 1), 4, 20, 0, 4, 120,
         [3, 0, 8, 0, 0, 0, 0x55, 2, 0, 5, 0, 0, 2, 3, 0, 1, 0, 0, 1])


# ---- the FFN fuzzers: b0, M, D-1, H-1, tile/compression, l1, values -----------------------------

def ffn_values(rng, m, d, h, gated, special=False, positive=False):
    n = m * d + (3 if gated else 2) * h * d + m * d
    out = []
    for _ in range(n):
        if special and rng.random() < 0.03:
            out.append(rng.randrange(8))  # NaN, +-Inf, -0
        elif positive:
            out.append(rng.randrange(129, 192))  # small positive values
        else:
            out.append(rng.randrange(96, 160))  # within [-0.5, 0.5)
    return out


def ffn_header(gated=True, type_=0, highest=False, special=False, hidden=0, m=4, d=8, h=40, tc=0, l1=0):
    b0 = (0 if gated else 1) | (type_ << 1) | (8 if highest else 0) | (16 if special else 0) | (hidden << 6)
    return [b0, m, d - 1, h - 1, tc, l1]


def ffn_seeds():
    rng = random.Random(11)
    for f, with_specials in (("fuzz_ffn", True), ("fuzz_saved_state", False)):
        seeds = {
            "gated-bf16": (dict(m=4, d=8, h=40, l1=1), {}),
            "plain-f32-highest-hidden": (dict(gated=False, type_=2, highest=True, hidden=2, m=3, d=5, h=70, tc=4), {}),
            "gated-f16-twell-hidden": (dict(type_=1, hidden=1, m=6, d=12, h=100, tc=2, l1=2), {}),
            # most units fire: more than 128 in a token (the backward recomputes those rows)
            "gated-dense-rows": (dict(m=2, d=4, h=150), dict(positive=True)),
        }
        if with_specials:
            seeds["gated-bf16-specials"] = (dict(special=True, hidden=2, m=5, d=6, h=30, l1=3), dict(special=True))
        for name, (hd, vd) in seeds.items():
            hdr = ffn_header(**hd)
            gated = hd.get("gated", True)
            vals = ffn_values(rng, hd["m"], hd["d"], hd["h"], gated, **vd)
            tail = []
            if f == "fuzz_saved_state":
                # 3 changes near the start (kind & 8; kind % 3: 0 byte, 1 16-bit, 2 32-bit word), at
                # 48 + pos: a 16-bit unit id H + 2 at 514 (the reference's unit ids start at 512),
                # a 32-bit -1 at 260 (token 1's count), a byte 0xff at 348
                tail = [2, 10, 0xD2, 0x01, 0, 0, 4, 8, 0xD4, 0, 0, 0, 2, 9, 0x2C, 0x01, 0, 0, 0xFF]
            write(f, name, hdr + vals + tail)


if __name__ == "__main__":
    raw_seeds()
    mutated_seeds()
    ffn_seeds()
