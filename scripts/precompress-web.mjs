// Writes <file>.br and <file>.gz next to each compressible file of dist/web (or the directory given), once, at
// build time: the Proxy serves them to browsers that accept them (src/proxy/static.ts) and never compresses
// while answering. Run after `vite build`: `node scripts/precompress-web.mjs [dir]`.
//
// Compressible: text types (html, js, mjs, css, json, map, svg, txt, webmanifest, wasm) of at least 1 KiB; a
// variant is kept only when it is smaller than the file. Brotli at its best quality, gzip at level 9: the cost
// is paid once per build. Existing variants are rewritten (a rebuild changes the files).
import { readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { brotliCompressSync, constants, gzipSync } from 'node:zlib';

const root = process.argv[2] ?? fileURLToPath(new URL('../dist/web/', import.meta.url));
const COMPRESSIBLE = /\.(html|js|mjs|css|json|map|svg|txt|webmanifest|wasm)$/i;
const MIN_BYTES = 1024;

async function* files(dir) {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* files(path);
    else if (entry.isFile()) yield path;
  }
}

let written = 0;
let saved = 0;
try {
  await stat(root);
} catch {
  console.error(`precompress-web: ${root} does not exist (run vite build first)`);
  process.exit(1);
}
for await (const file of files(root)) {
  if (!COMPRESSIBLE.test(file)) continue;
  const bytes = await readFile(file);
  for (const [ext, compress] of [
    ['.br', (b) => brotliCompressSync(b, { params: { [constants.BROTLI_PARAM_QUALITY]: constants.BROTLI_MAX_QUALITY, [constants.BROTLI_PARAM_SIZE_HINT]: b.length } })],
    ['.gz', (b) => gzipSync(b, { level: 9 })],
  ]) {
    const variant = bytes.length >= MIN_BYTES ? compress(bytes) : undefined;
    if (variant && variant.length < bytes.length) {
      await writeFile(file + ext, variant);
      written++;
      saved += bytes.length - variant.length;
    } else {
      await rm(file + ext, { force: true });
    }
  }
}
console.log(`precompress-web: ${written} files written in ${root} (${Math.round(saved / 1024)} KiB saved in all)`);
