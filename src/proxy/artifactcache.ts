/**
 * The Proxy's artifact cache on disk: whole files only, each under the SHA-256 of its key (route and path, never a
 * path joined onto the file system) with a small JSON sidecar naming the key, its size, its content type, whether it
 * is immutable and when it was stored. The index of what is held lives in memory in least-recently-used order (a
 * Map's insertion order: a hit moves the entry to the end); the total stays under maxBytes by evicting from the
 * front. A file is committed only by a rename of a fetch's finished temporary file, so a partial fetch is never a
 * cache entry. At start, immutable entries whose file and sidecar agree are kept (indices are dropped: they would be
 * stale), everything else in the directory the cache owns is removed, and so is every temporary file.
 *
 * Readers open an entry's file and keep the descriptor: an eviction or replacement unlinks the name, never the bytes a
 * reader is sending.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { open, rename, rm, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';
import { artifactMetrics } from '../metrics/artifacts.js';

export interface CacheEntry {
  key: string;
  size: number;
  type: string;
  immutable: boolean;
  storedAt: number;
}

const log = logger('artifacts');
const HASHED = /^[0-9a-f]{64}$/;

export class ArtifactCache {
  private readonly entries = new Map<string, CacheEntry>();
  private total = 0;
  readonly tmpDir: string;

  constructor(
    readonly dir: string,
    private readonly maxBytes: number,
    private readonly clock: () => number = Date.now,
  ) {
    this.tmpDir = join(dir, 'tmp');
    try {
      mkdirSync(this.tmpDir, { recursive: true, mode: 0o700 });
      rmSync(this.tmpDir, { recursive: true, force: true });
      mkdirSync(this.tmpDir, { mode: 0o700 });
      this.load();
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      throw new GatewayError('GW_ERR_ARTIFACT_CACHE', `cannot use the artifact cache directory ${dir} (${(err as NodeJS.ErrnoException).code ?? 'error'})`, { cause: err, details: { dir } });
    }
  }

  /** Kept immutable entries, oldest first (by the file's mtime); everything else the cache owns goes. */
  private load(): void {
    const kept: Array<CacheEntry & { mtime: number }> = [];
    for (const name of readdirSync(this.dir)) {
      if (name === 'tmp') continue;
      const hash = name.endsWith('.json') ? name.slice(0, -5) : name;
      if (!HASHED.test(hash)) continue; // not the cache's: left alone
      if (name.endsWith('.json')) continue; // read with its data file
      try {
        const meta = JSON.parse(readFileSync(join(this.dir, `${hash}.json`), 'utf8')) as CacheEntry;
        const st = statSync(join(this.dir, hash));
        if (meta.immutable === true && typeof meta.key === 'string' && fileName(meta.key) === hash && st.size === meta.size) {
          kept.push({ ...meta, mtime: st.mtimeMs });
          continue;
        }
      } catch {
        // no sidecar, or not one the cache wrote: removed below
      }
      this.removeFiles(hash);
    }
    const keptHashes = new Set(kept.map((k) => fileName(k.key)));
    for (const name of readdirSync(this.dir)) {
      const hash = name.slice(0, -5);
      if (name.endsWith('.json') && HASHED.test(hash) && !keptHashes.has(hash)) rmSync(join(this.dir, name), { force: true });
    }
    for (const { mtime: _m, ...e } of kept.sort((a, b) => a.mtime - b.mtime)) {
      this.entries.set(e.key, e);
      this.total += e.size;
    }
    this.evictFor(0);
    artifactMetrics.cacheBytes(this.total);
  }

  /** The entry, fresh (an index younger than ttlMs; an immutable file always), moved to the most recently used end. */
  lookup(key: string, ttlMs: number): CacheEntry | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (!e.immutable && this.clock() - e.storedAt >= ttlMs) return undefined;
    this.entries.delete(key);
    this.entries.set(key, e);
    return e;
  }

  /** Opens an entry's file for reading; undefined when it went in between (evicted, replaced): the caller fetches. */
  async openEntry(key: string): Promise<FileHandle | undefined> {
    try {
      return await open(join(this.dir, fileName(key)), 'r');
    } catch {
      this.forget(key);
      return undefined;
    }
  }

  /** A new temporary file's path for a fetch. */
  tempPath(): string {
    return join(this.tmpDir, `${randomBytes(12).toString('hex')}.part`);
  }

  /** Makes a finished fetch's temporary file the entry for key (replacing an older one); a file over the cap is not kept. */
  async commit(key: string, tmp: string, meta: Omit<CacheEntry, 'key' | 'storedAt'>): Promise<boolean> {
    if (meta.size > this.maxBytes) {
      await rm(tmp, { force: true });
      return false;
    }
    this.forget(key);
    this.evictFor(meta.size);
    const entry: CacheEntry = { key, ...meta, storedAt: this.clock() };
    const hash = fileName(key);
    try {
      writeFileSync(join(this.dir, `${hash}.json`), JSON.stringify(entry), { mode: 0o600 });
      await rename(tmp, join(this.dir, hash));
    } catch (err) {
      log.warn({ code: 'GW_ERR_ARTIFACT_CACHE', error: (err as NodeJS.ErrnoException).code }, 'cannot store a fetched artifact in the cache; it was relayed without being kept');
      await rm(tmp, { force: true });
      this.removeFiles(hash);
      return false;
    }
    this.entries.set(key, entry);
    this.total += entry.size;
    artifactMetrics.cacheBytes(this.total);
    return true;
  }

  /** Bytes held now. */
  bytes(): number {
    return this.total;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** Evicts least recently used entries until `incoming` more bytes fit under the cap. */
  private evictFor(incoming: number): void {
    for (const [key] of this.entries) {
      if (this.total + incoming <= this.maxBytes) break;
      this.forget(key);
      artifactMetrics.evicted();
    }
    artifactMetrics.cacheBytes(this.total);
  }

  private forget(key: string): void {
    const e = this.entries.get(key);
    if (!e) return;
    this.entries.delete(key);
    this.total -= e.size;
    this.removeFiles(fileName(key));
  }

  private removeFiles(hash: string): void {
    rmSync(join(this.dir, hash), { force: true });
    rmSync(join(this.dir, `${hash}.json`), { force: true });
  }
}

function fileName(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

