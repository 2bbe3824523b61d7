/**
 * Hand-made tar archives for the tarball tests: entries a real release never holds (names with "..", absolute
 * names, links out, devices), written header by header so the tests say exactly what is in them, and a snapshot of
 * a directory tree to show that a refused upgrade changed nothing.
 */
import { createHash } from 'node:crypto';
import { lstat, readdir, readFile, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';

export interface RawEntry {
  name: string;
  /** '0' file (default), '1' hard link, '2' symlink, '3' char device, '5' dir, '6' FIFO, 'x' pax, 'L' long name. */
  type?: string;
  body?: Buffer | string;
  link?: string;
  mode?: number;
  /** Declared size when it must differ from the body's. */
  size?: number;
}

function octal(value: number, len: number): string {
  return value.toString(8).padStart(len - 1, '0') + '\0';
}

export function tarHeader(e: RawEntry, size: number): Buffer {
  const h = Buffer.alloc(512);
  h.write(e.name.slice(0, 100), 0, 'utf8');
  h.write(octal(e.mode ?? (e.type === '5' ? 0o755 : 0o644), 8), 100, 'latin1');
  h.write(octal(0, 8), 108, 'latin1');
  h.write(octal(0, 8), 116, 'latin1');
  h.write(octal(size, 12), 124, 'latin1');
  h.write(octal(1_700_000_000, 12), 136, 'latin1');
  h.write('        ', 148, 'latin1');
  h.write(e.type ?? '0', 156, 'latin1');
  h.write((e.link ?? '').slice(0, 100), 157, 'utf8');
  h.write('ustar\0', 257, 'latin1');
  h.write('00', 263, 'latin1');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + ' ', 148, 'latin1');
  return h;
}

export function tarEntry(e: RawEntry): Buffer {
  const body = typeof e.body === 'string' ? Buffer.from(e.body) : (e.body ?? Buffer.alloc(0));
  const pad = Buffer.alloc((512 - (body.length % 512)) % 512);
  return Buffer.concat([tarHeader(e, e.size ?? body.length), body, pad]);
}

/** A pax extended header record set for the next entry. */
export function paxEntry(records: Record<string, string>): Buffer {
  const body = Object.entries(records)
    .map(([k, v]) => {
      const rest = ` ${k}=${v}\n`;
      let len = rest.length + 1;
      while (`${len}${rest}`.length !== len) len = `${len}${rest}`.length;
      return `${len}${rest}`;
    })
    .join('');
  return tarEntry({ name: 'PaxHeader', type: 'x', body });
}

/** The tar stream: entries, then the two zero blocks. */
export function tarOf(entries: Array<RawEntry | Buffer>): Buffer {
  return Buffer.concat([...entries.map((e) => (Buffer.isBuffer(e) ? e : tarEntry(e))), Buffer.alloc(1024)]);
}

export const targz = (entries: Array<RawEntry | Buffer>): Buffer => gzipSync(tarOf(entries), { level: 1 });

/** The entries of a release-shaped tarball around the hostile ones: gateway/install and gateway/gateway. */
export function releaseAround(version: string, hostile: Array<RawEntry | Buffer>): Buffer {
  return targz([
    { name: 'gateway/', type: '5' },
    { name: 'gateway/install', mode: 0o755, body: '#!/bin/sh\nset -eu\nmkdir -p "$GATEWAY_BIN_DIR"\ncp gateway "$GATEWAY_BIN_DIR/gateway"\necho "installed into $GATEWAY_BIN_DIR"\n' },
    { name: 'gateway/gateway', mode: 0o755, body: `#!/bin/sh\necho "Gateway v${version} git:test"\n` },
    ...hostile,
  ]);
}

export const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

/** Every path under dir with its type, mode, link target or content hash: equal snapshots, nothing changed. */
export async function snapshot(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const walk = async (rel: string): Promise<void> => {
    const abs = join(dir, rel);
    const st = await lstat(abs);
    const mode = (st.mode & 0o7777).toString(8);
    if (st.isSymbolicLink()) out[rel] = `link ${await readlink(abs)}`;
    else if (st.isDirectory()) {
      out[rel] = `dir ${mode}`;
      for (const name of (await readdir(abs)).sort()) await walk(rel ? `${rel}/${name}` : name);
    } else out[rel] = `file ${mode} ${sha256(await readFile(abs))}`;
  };
  await walk('');
  return out;
}
