/**
 * The entries of a release tarball, checked before anything is extracted: a pure, bounded, incremental reader of
 * the (already gunzipped) tar stream. It keeps no file data, only each entry's name, type and link, and refuses:
 *
 * - a name that is absolute, holds a `..` component, or goes through a symbolic link of the archive;
 * - a symbolic link whose target, resolved inside the archive (through its other links), leaves it, or is absolute;
 * - a hard link to anything but a regular file met earlier; a device, FIFO, sparse or unknown entry type;
 * - setuid / setgid modes; a name that appears twice;
 * - more entries or more bytes (headers and data, what gunzip produced) than the limits; a header whose checksum
 *   is wrong; an archive that ends inside an entry.
 *
 * Formats: ustar, GNU long names (L/K) and pax extended headers (x: path, linkpath, size; g is read and ignored).
 */
import { GatewayError } from '../errors.js';

export interface TarLimits {
  maxEntries: number;
  /** Bytes of the tar stream (gunzip's output): headers, data and padding. */
  maxUnpackedBytes: number;
  /** A GNU long name or a pax header. */
  maxMetaBytes: number;
}

export const DEFAULT_TAR_LIMITS: Readonly<TarLimits> = Object.freeze({
  maxEntries: 200_000,
  maxUnpackedBytes: 4 * 1024 ** 3,
  maxMetaBytes: 64 * 1024,
});

export type TarEntryType = 'file' | 'dir' | 'symlink' | 'hardlink';

export interface TarSummary {
  entries: number;
  /** Bytes of regular files. */
  fileBytes: number;
  /** Normalized names ("gateway/bin/gateway") with their type. */
  types: ReadonlyMap<string, TarEntryType>;
}

const BLOCK = 512;
const MAX_LINK_DEPTH = 40;

type State =
  | { kind: 'header' }
  | { kind: 'skip'; left: number }
  | { kind: 'meta'; type: string; size: number; left: number; parts: Buffer[] }
  | { kind: 'end' };

function refuse(why: string, details: Record<string, unknown> = {}): GatewayError {
  return new GatewayError('GW_ERR_UPGRADE_TARBALL', `the release tarball is not safe to extract: ${why}; nothing was extracted or installed`, { details });
}

function cstring(b: Buffer, start: number, len: number): string {
  const s = b.subarray(start, start + len);
  const nul = s.indexOf(0);
  return (nul === -1 ? s : s.subarray(0, nul)).toString('utf8');
}

/** An octal field, or GNU's base-256 (high bit set) for large values. */
function number(b: Buffer, start: number, len: number, what: string): number {
  const f = b.subarray(start, start + len);
  if (f[0]! & 0x80) {
    if (f[0] === 0xff) throw refuse(`a header's ${what} is negative`);
    let v = f[0]! & 0x7f;
    for (let i = 1; i < f.length; i++) {
      v = v * 256 + f[i]!;
      if (v > Number.MAX_SAFE_INTEGER) throw refuse(`a header's ${what} is too large`);
    }
    return v;
  }
  const text = cstring(f, 0, len).trim();
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw refuse(`a header's ${what} field is not a number (${JSON.stringify(text.slice(0, 20))})`);
  return parseInt(text, 8);
}

function checksumOk(h: Buffer): boolean {
  const stored = number(h, 148, 8, 'checksum');
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const c = i >= 148 && i < 156 ? 0x20 : h[i]!;
    unsigned += c;
    signed += c > 127 ? c - 256 : c;
  }
  return stored === unsigned || stored === signed;
}

/** pax records: "<len> <key>=<value>\n". */
export function parsePax(body: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let pos = 0;
  while (pos < body.length && body[pos] !== 0) {
    const sp = body.indexOf(0x20, pos);
    if (sp === -1 || sp - pos > 10) throw refuse('a pax header record has no length');
    const len = Number(body.subarray(pos, sp).toString('latin1'));
    if (!Number.isInteger(len) || len <= sp - pos + 1 || pos + len > body.length || body[pos + len - 1] !== 0x0a) throw refuse('a pax header record is malformed');
    const rec = body.subarray(sp + 1, pos + len - 1).toString('utf8');
    const eq = rec.indexOf('=');
    if (eq <= 0) throw refuse('a pax header record has no key');
    out.set(rec.slice(0, eq), rec.slice(eq + 1));
    pos += len;
  }
  return out;
}

/** A name as components, or a refusal: absolute, `..`, NUL. "./a//b/" -> ["a", "b"]. */
export function nameComponents(name: string, what: string): string[] {
  if (name.includes('\0')) throw refuse(`${what} ${JSON.stringify(name)} holds a NUL byte`, { name });
  if (name.startsWith('/')) throw refuse(`${what} ${JSON.stringify(name)} is an absolute path`, { name });
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw refuse(`${what} ${JSON.stringify(name)} climbs out with ".."`, { name });
  return parts;
}

export class TarScanner {
  private readonly limits: TarLimits;
  private state: State = { kind: 'header' };
  private carry: Buffer = Buffer.alloc(0);
  private total = 0;
  private entries = 0;
  private fileBytes = 0;
  private readonly types = new Map<string, TarEntryType>();
  private readonly links = new Map<string, string>();
  /** Every directory an entry's name goes through. */
  private readonly parents = new Set<string>();
  private pax = new Map<string, string>();
  private longName: string | undefined;
  private longLink: string | undefined;

  constructor(limits: Partial<TarLimits> = {}) {
    this.limits = { ...DEFAULT_TAR_LIMITS, ...limits };
  }

  /** Feeds gunzipped bytes. Throws GW_ERR_UPGRADE_TARBALL at the first problem. */
  push(chunk: Buffer): void {
    this.total += chunk.length;
    if (this.total > this.limits.maxUnpackedBytes) {
      throw refuse(`it unpacks to more than ${this.limits.maxUnpackedBytes} bytes (a release is far smaller)`, { limit: this.limits.maxUnpackedBytes });
    }
    let pos = 0;
    while (pos < chunk.length) {
      const s = this.state;
      if (s.kind === 'end') return; // what follows the end-of-archive blocks is ignored, as tar does
      if (s.kind === 'skip') {
        const n = Math.min(s.left, chunk.length - pos);
        s.left -= n;
        pos += n;
        if (s.left === 0) this.state = { kind: 'header' };
        continue;
      }
      if (s.kind === 'meta') {
        const n = Math.min(s.left, chunk.length - pos);
        s.parts.push(chunk.subarray(pos, pos + n));
        s.left -= n;
        pos += n;
        if (s.left === 0) this.meta(s.type, Buffer.concat(s.parts).subarray(0, s.size));
        continue;
      }
      const need = BLOCK - this.carry.length;
      const take = chunk.subarray(pos, pos + need);
      pos += take.length;
      this.carry = this.carry.length === 0 && take.length === BLOCK ? take : Buffer.concat([this.carry, take]);
      if (this.carry.length < BLOCK) return;
      const header = this.carry;
      this.carry = Buffer.alloc(0);
      this.header(header);
    }
  }

  /** The end of the stream: checks it ended between entries and that every link stays inside. */
  end(): TarSummary {
    const s = this.state;
    if (s.kind !== 'end' && !(s.kind === 'header' && this.carry.length === 0)) throw refuse('the archive ends in the middle of an entry (truncated)');
    if (this.entries === 0) throw refuse('the archive holds no entry');
    for (const [name, target] of this.links) this.checkLink(name, target);
    return { entries: this.entries, fileBytes: this.fileBytes, types: this.types };
  }

  private header(h: Buffer): void {
    if (h.every((b) => b === 0)) {
      this.state = { kind: 'end' };
      return;
    }
    if (!checksumOk(h)) throw refuse('a header checksum is wrong (not a tar archive, or a damaged one)');
    const type = String.fromCharCode(h[156]!);
    const size = number(h, 124, 12, 'size');
    const padded = Math.ceil(size / BLOCK) * BLOCK;
    if (type === 'x' || type === 'g' || type === 'L' || type === 'K') {
      if (size > this.limits.maxMetaBytes) throw refuse(`a ${type === 'L' || type === 'K' ? 'long name' : 'pax header'} of ${size} bytes is over the limit of ${this.limits.maxMetaBytes}`);
      this.state = padded === 0 ? { kind: 'header' } : { kind: 'meta', type, size, left: padded, parts: [] };
      if (padded === 0) this.meta(type, Buffer.alloc(0));
      return;
    }
    const realSize = this.pax.has('size') ? Number(this.pax.get('size')) : size;
    if (!Number.isSafeInteger(realSize) || realSize < 0) throw refuse('a pax size is not a number');
    this.entry(h, type, realSize);
    const realPadded = Math.ceil(realSize / BLOCK) * BLOCK;
    this.state = realPadded === 0 ? { kind: 'header' } : { kind: 'skip', left: realPadded };
  }

  private meta(type: string, body: Buffer): void {
    this.state = { kind: 'header' };
    if (type === 'x') this.pax = parsePax(body);
    else if (type === 'L') this.longName = cstring(body, 0, body.length);
    else if (type === 'K') this.longLink = cstring(body, 0, body.length);
    else parsePax(body); // 'g': checked for shape, not applied
  }

  private entry(h: Buffer, type: string, size: number): void {
    if (++this.entries > this.limits.maxEntries) throw refuse(`it holds more than ${this.limits.maxEntries} entries`, { limit: this.limits.maxEntries });
    const ustarPrefix = h.subarray(257, 263).toString('latin1') === 'ustar\0' ? cstring(h, 345, 155) : '';
    const rawName = this.pax.get('path') ?? this.longName ?? (ustarPrefix ? `${ustarPrefix}/${cstring(h, 0, 100)}` : cstring(h, 0, 100));
    const rawLink = this.pax.get('linkpath') ?? this.longLink ?? cstring(h, 157, 100);
    this.pax = new Map();
    this.longName = undefined;
    this.longLink = undefined;
    const kind = entryType(type, rawName);
    const parts = nameComponents(rawName, 'the entry');
    const name = parts.join('/');
    if (parts.length === 0) {
      if (kind === 'dir') return; // "./" itself
      throw refuse(`an entry of type ${kind} has an empty name`);
    }
    const mode = number(h, 100, 8, 'mode');
    if (mode & 0o6000) throw refuse(`${JSON.stringify(name)} is setuid or setgid (mode ${mode.toString(8)})`, { name });
    if ((kind === 'symlink' || kind === 'hardlink' || kind === 'dir') && size !== 0) throw refuse(`the ${kind} ${JSON.stringify(name)} carries ${size} bytes of data`, { name });
    for (let i = 1; i < parts.length; i++) {
      const via = parts.slice(0, i).join('/');
      if (this.types.get(via) === 'symlink') throw refuse(`${JSON.stringify(name)} would be written through the symbolic link ${JSON.stringify(via)}`, { name, via });
    }
    if (this.types.has(name) || (kind !== 'dir' && this.parents.has(name))) throw refuse(`${JSON.stringify(name)} appears twice`, { name });
    for (let i = 1; i < parts.length; i++) this.parents.add(parts.slice(0, i).join('/'));
    if (kind === 'symlink') {
      if (rawLink === '') throw refuse(`the symbolic link ${JSON.stringify(name)} has no target`, { name });
      if (rawLink.startsWith('/')) throw refuse(`the symbolic link ${JSON.stringify(name)} points to the absolute path ${JSON.stringify(rawLink)}`, { name, target: rawLink });
      this.links.set(name, rawLink);
    } else if (kind === 'hardlink') {
      const target = nameComponents(rawLink, `the hard link ${JSON.stringify(name)} to`).join('/');
      if (this.types.get(target) !== 'file') throw refuse(`the hard link ${JSON.stringify(name)} points to ${JSON.stringify(rawLink)}, which is not a file met earlier in the archive`, { name, target: rawLink });
    } else if (kind === 'file') this.fileBytes += size;
    this.types.set(name, kind);
  }

  /** Resolves a symbolic link's target inside the archive, through its other links; refuses if it leaves. */
  private checkLink(name: string, target: string): void {
    const out = () => refuse(`the symbolic link ${JSON.stringify(name)} points to ${JSON.stringify(target)}, outside the archive`, { name, target });
    const resolve = (dir: string[], path: string, depth: number): string[] => {
      if (depth > MAX_LINK_DEPTH) throw refuse(`the symbolic link ${JSON.stringify(name)} is part of a loop or a chain too long`, { name });
      if (path.startsWith('/')) throw out();
      const at = [...dir];
      for (const p of path.split('/')) {
        if (p === '' || p === '.') continue;
        if (p === '..') {
          if (at.length === 0) throw out();
          at.pop();
          continue;
        }
        at.push(p);
        const link = this.links.get(at.join('/'));
        if (link !== undefined) {
          const parent = at.slice(0, -1);
          at.splice(0, at.length, ...resolve(parent, link, depth + 1));
        }
      }
      return at;
    };
    resolve(name.split('/').slice(0, -1), target, 0);
  }
}

function entryType(type: string, name: string): TarEntryType {
  switch (type) {
    case '0':
    case '\0':
    case '7':
      return name.endsWith('/') ? 'dir' : 'file';
    case '1':
      return 'hardlink';
    case '2':
      return 'symlink';
    case '5':
      return 'dir';
    case '3':
      throw refuse(`${JSON.stringify(name)} is a character device`, { name });
    case '4':
      throw refuse(`${JSON.stringify(name)} is a block device`, { name });
    case '6':
      throw refuse(`${JSON.stringify(name)} is a FIFO`, { name });
    default:
      throw refuse(`${JSON.stringify(name)} has the entry type ${JSON.stringify(type)}, which a release does not use`, { name, type });
  }
}
