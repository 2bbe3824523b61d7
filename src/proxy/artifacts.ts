/**
 * Release artifacts through the Proxy, for agents that reach only it (docs/upgrades.md, "Artifacts through the
 * Proxy"): two public routes on the web port, GET and HEAD only, no credentials (releases and packages are public,
 * and what an agent installs is checked by the agent):
 *
 *   /v1/webapi/autoupdate/artifacts/<release tarball name>[.sha256]  → proxy_service.autoupdate_artifacts.download_url
 *   /v1/webapi/autoupdate/repo/<path>                                → proxy_service.autoupdate_artifacts.repo_url
 *
 * Which paths are taken is src/wire/artifacts.ts (a strict grammar, checked before anything is fetched). A file is
 * served from the cache (artifactcache.ts) when it is there and fresh: tarballs, packages and by-hash files by name
 * for good, indices (InRelease, Packages, repomd.xml ...) for index_ttl. Otherwise it is fetched (artifactfetch.ts,
 * through the Proxy's Dialer) and streamed to the client while it is written to the cache; requests for a file
 * already being fetched join that fetch (one upstream request for a flood); at most max_fetches different files are
 * fetched at once (more: 503). A fetch that fails before its body answers the error with its code; one that fails
 * after it cuts every client's connection (never a short file served as whole) and stores nothing.
 *
 * The Proxy checks nothing of the content on the agent's behalf: apt's, dnf's and zypper's signature checks and the
 * tarball's .sha256 stay the agent's, as for a direct download (docs/security.md says what a compromised Proxy can do).
 */
import type { FileHandle } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, httpStatus, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { artifactMetrics } from '../metrics/artifacts.js';
import { ArtifactPathError, parseArtifactPath, upstreamPath, type ArtifactPath, type ArtifactRoute } from '../wire/artifacts.js';
import { ArtifactCache, type CacheEntry } from './artifactcache.js';
import { ArtifactFetch } from './artifactfetch.js';

export interface ArtifactRelayOptions {
  downloadUrl: string | undefined;
  repoUrl: string | undefined;
  cacheDir: string;
  cacheMaxBytes: number;
  fetchTimeoutMs: number;
  /** The longest one fetch may take in all. */
  fetchDeadlineMs: number;
  indexTtlMs: number;
  maxFetches: number;
  dialer: Dialer;
  /** Extra CAs (PEM) trusted for https upstreams besides the system's. */
  ca?: string[];
  clock?: () => number;
  /** The largest file relayed (default artifactfetch.ts MAX_ARTIFACT_BYTES). */
  maxFileBytes?: number;
}

/** The header that says how a request was served: hit, miss or shared (tests and operators read it). */
export const CACHE_HEADER = 'x-gateway-artifact-cache';
const CHUNK = 64 * 1024;
const log = logger('artifacts');

type Source = { kind: 'hit'; entry: CacheEntry; fh: FileHandle } | { kind: 'miss' | 'shared'; fetch: ArtifactFetch; fh: FileHandle };

export class ArtifactRelay {
  private readonly cache: ArtifactCache | undefined;
  private readonly inflight = new Map<string, ArtifactFetch>();
  private readonly commits = new Set<Promise<void>>();

  constructor(private readonly options: ArtifactRelayOptions) {
    // The cache directory is made only when there is something to relay.
    this.cache = options.downloadUrl || options.repoUrl ? new ArtifactCache(options.cacheDir, options.cacheMaxBytes, options.clock) : undefined;
  }

  /** Takes GET/HEAD under the two prefixes; false for any other path (the web server tries its other routes). */
  handle(req: IncomingMessage, res: ServerResponse): boolean {
    const raw = req.url ?? '/';
    let parsed: ArtifactPath | undefined;
    try {
      parsed = parseArtifactPath(raw);
      if (parsed === undefined) return false;
    } catch (err) {
      if (!(err instanceof ArtifactPathError)) throw err;
      req.resume();
      const route: ArtifactRoute = raw.startsWith('/v1/webapi/autoupdate/artifacts') ? 'artifacts' : 'repo';
      artifactMetrics.request(route, 'refused');
      sendError(res, false, new GatewayError('GW_ERR_ARTIFACT_BAD_PATH', `${err.message}; nothing was fetched`));
      return true;
    }
    req.resume();
    const head = req.method === 'HEAD';
    if (req.method !== 'GET' && !head) {
      artifactMetrics.request(parsed.route, 'refused');
      sendError(res, false, new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method} is not allowed on the artifact routes`, { hint: 'Use GET (or HEAD).' }), { allow: 'GET, HEAD' });
      return true;
    }
    void this.serve(parsed, head, res).catch((err: unknown) => {
      const e = toGatewayError(err);
      log.warn({ code: e.code }, e.message);
      if (!res.headersSent) sendError(res, head, e);
      else res.destroy();
    });
    return true;
  }

  private upstreamBase(route: ArtifactRoute): string | undefined {
    return route === 'artifacts' ? this.options.downloadUrl : this.options.repoUrl;
  }

  private async serve(p: ArtifactPath, head: boolean, res: ServerResponse): Promise<void> {
    const base = this.upstreamBase(p.route);
    if (!base || !this.cache) {
      artifactMetrics.request(p.route, 'refused');
      const key = p.route === 'artifacts' ? 'download_url' : 'repo_url';
      return sendError(res, head, new GatewayError('GW_ERR_ARTIFACT_DISABLED', `this Proxy relays no ${p.route === 'artifacts' ? 'release tarballs' : 'package repository'}: proxy_service.autoupdate_artifacts.${key} is not set`));
    }
    let source: Source;
    try {
      source = await this.source(p, base);
    } catch (err) {
      const e = toGatewayError(err);
      artifactMetrics.request(p.route, e.code === 'GW_ERR_ARTIFACT_NOT_FOUND' ? 'not_found' : e.code === 'GW_ERR_ARTIFACT_BUSY' ? 'busy' : 'failed');
      if (httpStatus(e.code) >= 500) log.warn({ code: e.code, route: p.route }, e.message);
      return sendError(res, head, e);
    }
    artifactMetrics.request(p.route, source.kind);
    const length = source.kind === 'hit' ? source.entry.size : source.fetch.length;
    res.writeHead(200, {
      'content-type': source.kind === 'hit' ? source.entry.type : source.fetch.type,
      ...(length === undefined ? {} : { 'content-length': length }),
      'cache-control': p.immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
      'x-content-type-options': 'nosniff',
      [CACHE_HEADER]: source.kind,
    });
    try {
      if (head) return void res.end();
      await pump(source, res);
    } finally {
      if (source.kind === 'hit') await source.fh.close().catch(() => undefined);
      else source.fetch.release();
    }
  }

  /** A fresh cache entry, a fetch under way, or a new fetch; resolves once the body can be read. */
  private async source(p: ArtifactPath, base: string): Promise<Source> {
    const cache = this.cache!;
    const key = `${p.route}:${p.path}`;
    const entry = cache.lookup(key, this.options.indexTtlMs);
    if (entry) {
      const fh = await cache.openEntry(key);
      if (fh) return { kind: 'hit', entry, fh };
    }
    let fetch = this.inflight.get(key);
    const kind = fetch ? 'shared' : 'miss';
    if (!fetch) {
      if (this.inflight.size >= this.options.maxFetches) {
        throw new GatewayError('GW_ERR_ARTIFACT_BUSY', `this Proxy is already fetching ${this.inflight.size} artifacts, the most it fetches at once (max_fetches)`);
      }
      fetch = this.startFetch(key, p, `${base}/${upstreamPath(p.path)}`);
    }
    fetch.hold(); // before any await: the file stays open for this reader
    try {
      await fetch.started;
    } catch (err) {
      fetch.release();
      throw err;
    }
    return { kind, fetch, fh: fetch.file() };
  }

  private startFetch(key: string, p: ArtifactPath, url: string): ArtifactFetch {
    const cache = this.cache!;
    const tmpPath = cache.tempPath();
    const fetch = new ArtifactFetch({
      dialer: this.options.dialer,
      url,
      tmpPath,
      fetchTimeoutMs: this.options.fetchTimeoutMs,
      deadlineMs: this.options.fetchDeadlineMs,
      ...(this.options.maxFileBytes === undefined ? {} : { maxBytes: this.options.maxFileBytes }),
      ...(this.options.ca ? { ca: this.options.ca } : {}),
    });
    this.inflight.set(key, fetch);
    fetch.hold(); // the relay's own, until the file is committed and the fetch forgotten
    const committed: Promise<void> = fetch.settled.then(async () => {
      try {
        if (fetch.state === 'done') await cache.commit(key, tmpPath, { size: fetch.written, type: fetch.type, immutable: p.immutable });
        else if (fetch.error && httpStatus(fetch.error.code) >= 500) log.warn({ code: fetch.error.code, route: p.route }, fetch.error.message);
      } finally {
        this.inflight.delete(key);
        this.commits.delete(committed);
        fetch.release();
      }
    });
    this.commits.add(committed);
    return fetch;
  }

  /**
   * Resolves once every fetch started so far is committed to the cache or dropped. A client has its last byte before
   * the relay commits the file, so whoever asks the cache right after a download (tests, a drain) waits on this.
   */
  async settled(): Promise<void> {
    while (this.commits.size > 0) await Promise.allSettled([...this.commits]);
  }

  /** What is cached now (tests, and the docs' example). */
  cachedBytes(): number {
    return this.cache?.bytes() ?? 0;
  }

  /** Whether a route's path is in the cache now. */
  isCached(route: ArtifactRoute, path: string): boolean {
    return this.cache?.has(`${route}:${path}`) ?? false;
  }
}

/** Sends the file to the client: all of a cache entry, or a fetch's file as it grows; a failed fetch cuts the connection. */
async function pump(source: Source, res: ServerResponse): Promise<void> {
  const buf = Buffer.allocUnsafe(CHUNK);
  let pos = 0;
  let gone = false;
  res.once('close', () => (gone = true));
  for (;;) {
    if (gone) return;
    const available = source.kind === 'hit' ? source.entry.size : source.fetch.written;
    if (pos < available) {
      const { bytesRead } = await source.fh.read(buf, 0, Math.min(CHUNK, available - pos), pos);
      if (bytesRead === 0) throw new GatewayError('GW_ERR_ARTIFACT_CACHE', 'a cached artifact is shorter than recorded');
      pos += bytesRead;
      artifactMetrics.servedBytes(bytesRead);
      if (!res.write(Buffer.from(buf.subarray(0, bytesRead)))) await drained(res);
      continue;
    }
    if (source.kind === 'hit' || source.fetch.state === 'done') return void res.end();
    if (source.fetch.state === 'failed') {
      res.destroy(); // the client sees the connection cut, never a short file as whole
      return;
    }
    await source.fetch.wait();
  }
}

function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

function sendError(res: ServerResponse, head: boolean, err: GatewayError, extra: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const body = JSON.stringify({ error: err.toJSON() });
  res.writeHead(httpStatus(err.code), { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'cache-control': 'no-store', ...extra });
  if (head) res.end();
  else res.end(body);
}
