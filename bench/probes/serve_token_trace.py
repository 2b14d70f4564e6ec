#!/usr/bin/env python3
"""Where serve_token's time goes, phase by phase, inside the real library.

  serve_token_trace.py patch SERVE_CUH   # adds clock64 stamps to serve_token, in place
  serve_token_trace.py table TRACE...    # per-phase means and maxima from the printed stamps

The patch gives thread 0 of every block a clock64() stamp after each step of the kernel (the
wait for the gate, the mask words and scan, the list, h, y, the write of y, the statistics) and
makes one launch of the process (the 300th by the counter it adds) print a line per block:
`TRACE W<warps> x<split> t<token> n<units> g<start ns> <end ns> c <cycles of each step>`.
It is a diagnostic build only: patch a copy of the tree, or restore the file after building a
variant library from it (scripts/variant-lib.sh build OUT "" device/ffn_forward.cu), then run
the benchmark with that library at one serving point. Cycles are read at 1.98 GHz (H100/H200
boost clock). Used in bench/NOTES.md, "serve_token, phase by phase" (2026-11-26).
"""
import statistics
import sys

PRINT = ('if (tid == 0 && dbg_launch == 300) { unsigned long long g1; '
         'asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(g1)); '
         'printf("TRACE W%%d x%%d t%%lld n%%d g%%llu %%llu c %%lld %%lld %%lld %%lld %%lld %%lld %%lld\\n", '
         'W, split, t, total, g0, g1, tr[1]-tr[0], tr[2]-tr[1], tr[3]-tr[2], tr[4]-tr[3], tr[5]-tr[4], '
         'tr[6]-tr[5], %s); }')
PHASES = ['wait', 'words', 'list', 'h', 'y', 'write', 'finish']


def insert_after(body, anchor, text, start=0):
    i = body.index(anchor, start) + len(anchor)
    return body[:i] + text + body[i:], i


def patch(path):
    src = open(path).read()
    k = src.index('template <class T, int W, int V> __global__')
    head, body = src[:k], src[k:]
    body, _ = insert_after(body, '    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;\n',
                           '    long long tr[8]; tr[0] = clock64();\n'
                           '    unsigned long long g0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));\n'
                           '#define TR(i) tr[i] = clock64()\n')
    body, _ = insert_after(body, 'allow_dependent_launch();\n', '    TR(1);\n')
    body, _ = insert_after(body, '    if (lane == 31) warp_total[warp] = incl;\n    __syncthreads();\n', '    TR(2);\n')
    window = body.index('for (int win = 0;')
    body, i = insert_after(body, '        __syncthreads();\n', '        TR(3);\n', window)
    body, i = insert_after(body, '        __syncthreads();\n', '        TR(4);\n', i)
    body, i = insert_after(body, '        __syncthreads();  // the next window overwrites the list\n', '        TR(5);\n', i)
    body = body.replace('    if (!counts_row) return;\n',
                        '    TR(6);\n    if (!counts_row) { ' + PRINT % '0ll' + ' return; }\n')
    end = body.rindex('\n}\n')
    body = (body[:end] + '\n    TR(7); ' + PRINT % 'tr[7]-tr[6]' +
            ' if (tid == 0 && split == 0 && t == 0) atomicAdd(&dbg_launch, 1u);' + body[end:])
    head = head.replace('constexpr int kServeTokenCap = 512, kServeTokenBatch = 8;',
                        'constexpr int kServeTokenCap = 512, kServeTokenBatch = 8;\n__device__ unsigned dbg_launch;')
    open(path, 'w').write(head + body)


def table(paths, ghz=1.98):
    for path in paths:
        rows = []
        for line in open(path):
            if not line.startswith('TRACE'):
                continue
            p = line.split()
            rows.append((int(p[5][1:]), int(p[6]), int(p[4][1:]), [int(c) for c in p[8:15]]))
        if not rows:
            print(f'{path}: no TRACE lines')
            continue
        rows.sort()
        launches = [[rows[0]]]  # a launch's blocks start within a few microseconds
        for r in rows[1:]:
            if r[0] - launches[-1][-1][0] < 20000:
                launches[-1].append(r)
            else:
                launches.append([r])
        blocks = max(launches, key=len)
        start, end = min(r[0] for r in blocks), max(r[1] for r in blocks)
        cells = []
        for i, name in enumerate(PHASES):
            us = [r[3][i] / (ghz * 1e3) for r in blocks]
            cells.append(f'{name} {statistics.mean(us):.2f}/{max(us):.2f}')
        print(f'{path}: {len(blocks)} blocks, launch span {(end - start) / 1e3:.2f} us, units mean '
              f'{statistics.mean(r[2] for r in blocks):.1f} max {max(r[2] for r in blocks)}; '
              f'per step mean/max us: ' + ' | '.join(cells))


if __name__ == '__main__':
    if len(sys.argv) >= 3 and sys.argv[1] == 'patch':
        patch(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == 'table':
        table(sys.argv[2:])
    else:
        sys.exit(__doc__)
