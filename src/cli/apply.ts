/**
 * The files of `gwctl apply -f FILE|DIR ...`, read before anything is asked of the Auth Service, within bounds.
 *
 * A directory gives its *.yaml, *.yml and *.json files in sorted order (code point order of the names, so the
 * order is the same on every machine), not its subdirectories unless -R; a symlink is followed to a regular
 * file, and with -R to a directory, but a directory reached twice (a link to an ancestor: a loop) is refused, as
 * is a link that loops on itself (ELOOP). Only regular files are read (a FIFO or /dev/zero would never end). The
 * caps of one apply (MAX_APPLY_FILES files, MAX_APPLY_BYTES characters) are checked from each file's size before
 * it is read, and again on what was read, so a 10 MB file is refused without being read whole.
 */
import { closeSync, openSync, readdirSync, readSync, realpathSync, statSync, type Stats } from 'node:fs';
import { join } from 'node:path';
import { MAX_APPLY_BYTES, MAX_APPLY_FILES } from '../auth/resources/index.js';
import { GatewayError } from '../errors.js';

export interface ApplyFile {
  source: string;
  manifest: string;
}

const MANIFEST_FILE = /\.(ya?ml|json)$/i;
/** Directory levels -R descends (a deep tree of links is refused, not walked). */
const MAX_DEPTH = 16;

function sourceError(path: string, why: string, err?: unknown): GatewayError {
  return new GatewayError('GW_ERR_APPLY_SOURCE', `${path}: ${why}`, { ...(err === undefined ? {} : { cause: err }), details: { path } });
}

function tooLarge(what: string): GatewayError {
  return new GatewayError('GW_ERR_APPLY_TOO_LARGE', what, { details: { max_files: MAX_APPLY_FILES, max_bytes: MAX_APPLY_BYTES } });
}

function statOf(path: string): Stats {
  try {
    return statSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw sourceError(path, code === 'ELOOP' ? 'a symbolic link loop' : code === 'ENOENT' ? 'no such file or directory' : `cannot be read (${code ?? (err as Error).message})`, err);
  }
}

/** The manifest files a path names, in order. */
function collect(path: string, recursive: boolean, explicit: boolean, seen: Set<string>, depth: number, out: string[]): void {
  const st = statOf(path);
  if (st.isFile()) {
    if (explicit || MANIFEST_FILE.test(path)) out.push(path);
  } else if (st.isDirectory()) {
    if (!explicit && !recursive) return;
    const real = realpathSync(path);
    if (seen.has(real)) throw sourceError(path, 'a directory loop (a link to a directory already read)');
    if (depth > MAX_DEPTH) throw sourceError(path, `more than ${MAX_DEPTH} directory levels`);
    seen.add(real);
    let names: string[];
    try {
      names = readdirSync(path).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    } catch (err) {
      throw sourceError(path, `cannot be listed (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`, err);
    }
    for (const name of names) {
      if (name.startsWith('.')) continue;
      collect(join(path, name), recursive, false, seen, depth + 1, out);
      if (out.length > MAX_APPLY_FILES) throw tooLarge(`more than ${MAX_APPLY_FILES} manifest files under ${path}`);
    }
  } else if (explicit) {
    throw sourceError(path, 'not a regular file or a directory');
  }
}

/** Reads at most max characters' worth of bytes; more is GW_ERR_APPLY_TOO_LARGE (the file grew, or lied in stat). */
function readBounded(path: string, max: number): string {
  const fd = path === '-' ? 0 : openSync(path, 'r');
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const buf = Buffer.alloc(64 * 1024);
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      total += n;
      if (total > max) throw tooLarge(`${path}: the files hold more than ${MAX_APPLY_BYTES} bytes together`);
      chunks.push(buf.subarray(0, n));
    }
    return Buffer.concat(chunks).toString('utf8');
  } finally {
    if (fd !== 0) closeSync(fd);
  }
}

/** The files of -f arguments (each a file, a directory or - for standard input), read whole, within the caps. */
export function readApplyFiles(paths: readonly string[], recursive: boolean): ApplyFile[] {
  const names: string[] = [];
  const seen = new Set<string>();
  for (const path of paths) {
    if (path === '-') names.push('-');
    else collect(path, recursive, true, seen, 0, names);
    if (names.length > MAX_APPLY_FILES) throw tooLarge(`more than ${MAX_APPLY_FILES} manifest files`);
  }
  if (names.length === 0) throw sourceError(paths.join(', '), `no .yaml, .yml or .json file${recursive ? '' : ' (give -R to read subdirectories)'}`);
  let budget = MAX_APPLY_BYTES;
  const files: ApplyFile[] = [];
  for (const name of names) {
    if (name !== '-' && statOf(name).size > budget) throw tooLarge(`${name}: the files hold more than ${MAX_APPLY_BYTES} bytes together`);
    let manifest: string;
    try {
      manifest = readBounded(name, budget);
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      throw sourceError(name, `cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`, err);
    }
    budget -= Buffer.byteLength(manifest);
    files.push({ source: name === '-' ? 'stdin' : name, manifest });
  }
  return files;
}
