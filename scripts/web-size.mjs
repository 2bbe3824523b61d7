// Prints the size of the built Web UI (dist/web/, after `npm run build`): raw, gzip and brotli per file, and what
// the first page loads (index.html, its entry script and style sheet) against the terminal's chunk, which is
// loaded only when a terminal opens. docs/web.md records these figures. `--json` prints them as JSON.
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';

const root = fileURLToPath(new URL('../dist/web/', import.meta.url));
if (!existsSync(join(root, 'index.html'))) {
  console.error('dist/web/index.html is missing: run `npm run build` first');
  process.exit(1);
}

function files(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]));
}

function sizes(file) {
  const data = readFileSync(file);
  return {
    raw: data.length,
    gz: gzipSync(data, { level: 9 }).length,
    br: brotliCompressSync(data, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }).length,
  };
}

const rows = files(root)
  .filter((f) => !f.endsWith('.br') && !f.endsWith('.gz'))
  .map((f) => ({ file: relative(root, f), ...sizes(f) }))
  .sort((a, b) => b.raw - a.raw);

// What the first page needs: index.html and what it links (script src, link href under /web/assets/).
const index = readFileSync(join(root, 'index.html'), 'utf8');
const linked = new Set([...index.matchAll(/(?:src|href)="\/web\/(assets\/[^"]+)"/g)].map((m) => m[1]));
linked.add('index.html');
const sum = (list) => list.reduce((t, r) => ({ raw: t.raw + r.raw, gz: t.gz + r.gz, br: t.br + r.br }), { raw: 0, gz: 0, br: 0 });
const first = sum(rows.filter((r) => linked.has(r.file)));
const all = sum(rows);

if (process.argv.includes('--json')) {
  console.log(JSON.stringify({ files: rows, first_load: first, total: all }, null, 2));
} else {
  const kib = (n) => `${(n / 1024).toFixed(1)} KiB`.padStart(10);
  console.log(`${'file'.padEnd(44)}${'raw'.padStart(10)}${'gzip'.padStart(10)}${'brotli'.padStart(10)}`);
  for (const r of rows) console.log(`${r.file.padEnd(44)}${kib(r.raw)}${kib(r.gz)}${kib(r.br)}`);
  console.log(`${'first page (index.html + linked assets)'.padEnd(44)}${kib(first.raw)}${kib(first.gz)}${kib(first.br)}`);
  console.log(`${'total'.padEnd(44)}${kib(all.raw)}${kib(all.gz)}${kib(all.br)}`);
}
