// Writes <file>.br and <file>.gz next to each text asset of dist/web/ (after `vite build`), so that the Proxy
// serves them precompressed (src/proxy/static.ts) instead of compressing on every request. zlib only, no package.
// A compressed copy that is not smaller than the file is not written (the Proxy then serves the file itself).
import { readdirSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';

const root = process.argv[2] ?? fileURLToPath(new URL('../dist/web/', import.meta.url));
const TEXT = /\.(html|js|mjs|css|svg|json|txt|map|wasm)$/;

function files(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]));
}

// Copies of an earlier run: rewritten below when their file is still there.
for (const file of files(root)) if (file.endsWith('.br') || file.endsWith('.gz')) rmSync(file);

let count = 0;
for (const file of files(root)) {
  if (!TEXT.test(file)) continue;
  const data = readFileSync(file);
  const br = brotliCompressSync(data, { params: { [constants.BROTLI_PARAM_QUALITY]: 11, [constants.BROTLI_PARAM_SIZE_HINT]: data.length, [constants.BROTLI_PARAM_MODE]: constants.BROTLI_MODE_TEXT } });
  const gz = gzipSync(data, { level: 9 });
  if (br.length < data.length) writeFileSync(`${file}.br`, br);
  if (gz.length < data.length) writeFileSync(`${file}.gz`, gz);
  count++;
}
console.log(`compress-web: ${count} files of ${root} written as .br and .gz`);
