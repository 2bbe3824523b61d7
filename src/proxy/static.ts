/**
 * The Web UI's files on the web port: dist/web/ (written by `vite build` in `npm run build`) served at /web/, with
 * `/` sent to /web/. docs/proxy.md ("The Web UI") describes what a browser gets.
 *
 *   index      the directory is listed ONCE, when the Proxy starts: every regular file (no symbolic link, no
 *              dot-file) becomes one entry, keyed by its URL path. A request path is only ever looked up in that
 *              map, never joined onto the file system, so no path a client sends can name a file outside the
 *              index. Paths that try (dot segments, NUL and control bytes, backslashes, encoded slashes, bad
 *              percent-encoding) are refused with 400 before the lookup. Bounded: at most MAX_FILES files,
 *              MAX_DEPTH directories deep, MAX_SITE_BYTES in all; a file's bytes are read on its first request and
 *              kept.
 *   SPA        /web/<path> that is no file answers /web/index.html (the page routes on the client), except under
 *              /web/assets/ (a missing hashed asset is a 404: the browser would not run HTML as a script).
 *   caching    /web/assets/ is content-hashed by the build: `public, max-age=31536000, immutable`; index.html
 *              `no-store` (it names the current assets); other files `no-cache` (revalidated by ETag).
 *   encodings  a sibling `<file>.br` / `<file>.gz` written at build time is served when the request's
 *              Accept-Encoding allows it (br first), with `vary: accept-encoding`.
 *   methods    GET and HEAD; anything else is 405.
 *   headers    the security headers of SECURITY_HEADERS on every answer of the site, errors included.
 *
 * Not built (no dist/web/index.html, a developer who has not run the build): /web/ answers 503 with a short page
 * saying to run `npm run build`, logged once at start.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { lstat, readdir, readFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { httpStatus, type ErrorCode } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { escapeHtml } from '../net/http.js';

export const WEB_PREFIX = '/web/';
const ASSETS_PREFIX = '/web/assets/';
const INDEX = '/web/index.html';

/** Bounds of the index (a Web UI build is about a hundred files and a few MiB). */
export const STATIC_LIMITS = Object.freeze({ MAX_FILES: 10_000, MAX_DEPTH: 12, MAX_SITE_BYTES: 64 * 1024 * 1024, MAX_PATH_BYTES: 2048 });

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  html: 'text/html; charset=utf-8',
  js: 'text/javascript; charset=utf-8',
  mjs: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
  json: 'application/json; charset=utf-8',
  map: 'application/json; charset=utf-8',
  webmanifest: 'application/manifest+json; charset=utf-8',
  txt: 'text/plain; charset=utf-8',
  svg: 'image/svg+xml',
  png: 'image/png',
  jpg: 'image/jpeg',
  jpeg: 'image/jpeg',
  gif: 'image/gif',
  webp: 'image/webp',
  ico: 'image/x-icon',
  woff: 'font/woff',
  woff2: 'font/woff2',
  ttf: 'font/ttf',
  wasm: 'application/wasm',
};

/** The Content-Security-Policy of every page; form-action may name more origins (an IdP a page posts to). */
export function contentSecurityPolicy(formActionOrigins: readonly string[] = []): string {
  return [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    ["form-action 'self'", ...formActionOrigins].join(' '),
    "frame-ancestors 'none'",
  ].join('; ');
}

/** The headers of every answer of the site (web contract). */
export function securityHeaders(formActionOrigins: readonly string[] = []): Readonly<Record<string, string>> {
  return Object.freeze({
    'content-security-policy': contentSecurityPolicy(formActionOrigins),
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'strict-transport-security': 'max-age=31536000',
    'x-frame-options': 'DENY',
    'cross-origin-opener-policy': 'same-origin',
  });
}

type Encoding = 'br' | 'gzip';

interface Body {
  bytes: Buffer;
  etag: string;
}

/** One file of the index: where it is, and its precompressed siblings. */
interface Entry {
  file: string;
  size: number;
  type: string;
  cache: string;
  variants: Partial<Record<Encoding, string>>;
  /** Bodies read so far, by encoding ('identity' too); a failed read is forgotten so that it is tried again. */
  loaded: Map<string, Promise<Body>>;
}

export interface StaticSiteOptions {
  /** The directory to serve; dist/web of this installation unless a test says otherwise. */
  root?: string;
  /** Origins a page may submit forms to besides its own (CSP form-action). */
  formActionOrigins?: readonly string[];
  log?: Logger;
}

/** dist/web of the installation this code runs from: the folder that holds package.json, then dist/web. */
export function defaultWebRoot(from: string = fileURLToPath(import.meta.url)): string {
  let dir = dirname(from);
  for (let i = 0; i < 8; i++) {
    if (existsSync(join(dir, 'package.json'))) return join(dir, 'dist', 'web');
    const up = dirname(dir);
    if (up === dir) break;
    dir = up;
  }
  // Bundled into dist/cli/ without a package.json above it: dist/web is the sibling of dist/cli.
  return resolve(dirname(from), '..', 'web');
}

/** Lists root: URL path → entry, within STATIC_LIMITS; paths of files left out are logged. */
async function buildIndex(root: string, log: Logger): Promise<Map<string, Entry>> {
  const files = new Map<string, { file: string; size: number }>();
  let total = 0;
  const walk = async (dir: string, url: string, depth: number): Promise<void> => {
    if (depth > STATIC_LIMITS.MAX_DEPTH) return void log.warn({ dir }, 'web UI: directory too deep, not served');
    const names = (await readdir(dir)).sort();
    for (const name of names) {
      if (name.startsWith('.') || !/^[A-Za-z0-9._@+~-]+$/.test(name)) continue;
      const file = join(dir, name);
      const st = await lstat(file);
      if (st.isDirectory()) await walk(file, `${url}${name}/`, depth + 1);
      else if (st.isFile()) {
        if (files.size >= STATIC_LIMITS.MAX_FILES || total + st.size > STATIC_LIMITS.MAX_SITE_BYTES) {
          log.warn({ file, max_files: STATIC_LIMITS.MAX_FILES, max_bytes: STATIC_LIMITS.MAX_SITE_BYTES }, 'web UI: over the limits of the index, not served');
          continue;
        }
        total += st.size;
        files.set(`${url}${name}`, { file, size: st.size });
      }
    }
  };
  await walk(root, WEB_PREFIX, 0);
  const index = new Map<string, Entry>();
  for (const [url, f] of files) {
    const compressed = /\.(br|gz)$/.exec(url);
    if (compressed && files.has(url.slice(0, -compressed[0].length))) continue; // a variant of its sibling
    const variants: Partial<Record<Encoding, string>> = {};
    if (files.has(`${url}.br`)) variants.br = files.get(`${url}.br`)!.file;
    if (files.has(`${url}.gz`)) variants.gzip = files.get(`${url}.gz`)!.file;
    index.set(url, { ...f, type: contentTypeOf(url), cache: cacheControlOf(url), variants, loaded: new Map() });
  }
  return index;
}

function contentTypeOf(url: string): string {
  const ext = /\.([A-Za-z0-9]+)$/.exec(url)?.[1]?.toLowerCase() ?? '';
  return CONTENT_TYPES[ext] ?? 'application/octet-stream';
}

function cacheControlOf(url: string): string {
  if (url === INDEX) return 'no-store';
  if (url.startsWith(ASSETS_PREFIX)) return 'public, max-age=31536000, immutable';
  return 'no-cache';
}

/**
 * The request path as a key of the index, or why it is refused. Decoded exactly once; refused: bad
 * percent-encoding, an encoded "/" or "\", NUL and other control bytes, "\", empty, "." and ".." segments.
 */
export function staticPathOf(rawPath: string): { path: string } | { refused: string } {
  if (Buffer.byteLength(rawPath) > STATIC_LIMITS.MAX_PATH_BYTES) return { refused: 'the path is too long' };
  if (/%(2f|5c)/i.test(rawPath)) return { refused: 'the path has an encoded "/" or "\\"' };
  let path: string;
  try {
    path = decodeURIComponent(rawPath);
  } catch {
    return { refused: 'the path is not valid percent-encoding' };
  }
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f\\]/.test(path)) return { refused: 'the path has a control character or "\\"' };
  const segments = path.slice(WEB_PREFIX.length).split('/');
  if (segments.slice(0, -1).some((s) => s === '') || segments.some((s) => s === '.' || s === '..')) return { refused: 'the path has an empty, "." or ".." segment' };
  return { path };
}

/** The encodings the client accepts among ours, in our order of preference (br, then gzip). */
export function acceptedEncodings(header: string | undefined): Encoding[] {
  if (!header) return [];
  const q = new Map<string, number>();
  for (const part of header.slice(0, 1024).split(',').slice(0, 32)) {
    const [token, ...params] = part.trim().toLowerCase().split(';');
    const qp = params.map((p) => p.trim()).find((p) => p.startsWith('q='));
    const value = qp ? Number(qp.slice(2)) : 1;
    if (token) q.set(token, Number.isFinite(value) ? value : 0);
  }
  const ok = (e: string) => (q.get(e) ?? q.get('*') ?? 0) > 0;
  return (['br', 'gzip'] as const).filter(ok);
}

export class StaticSite {
  private readonly headers: Readonly<Record<string, string>>;

  private constructor(
    private readonly index: Map<string, Entry> | undefined,
    readonly root: string,
    formActionOrigins: readonly string[],
  ) {
    this.headers = securityHeaders(formActionOrigins);
  }

  /** Lists the directory (once); a missing or unbuilt one gives a site that says to build it. */
  static async load(options: StaticSiteOptions = {}): Promise<StaticSite> {
    const log = options.log ?? logger('proxy');
    const root = options.root ?? defaultWebRoot();
    let index: Map<string, Entry> | undefined;
    try {
      index = await buildIndex(root, log);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') log.warn({ root, err: (err as Error).message }, 'web UI: cannot list its files');
    }
    if (!index?.has(INDEX)) {
      log.warn({ root }, 'the web UI is not built: /web/ answers a page saying so; run npm run build');
      index = undefined;
    }
    return new StaticSite(index, root, options.formActionOrigins ?? []);
  }

  /** Whether the UI's files were found. */
  get built(): boolean {
    return this.index !== undefined;
  }

  /** Files in the index (variants not counted). */
  get files(): number {
    return this.index?.size ?? 0;
  }

  /** Answers `/`, `/web` and `/web/...`; false for any other path (the API router's). */
  handle(req: IncomingMessage, res: ServerResponse): boolean {
    const url = req.url ?? '/';
    const q = url.indexOf('?');
    const raw = q < 0 ? url : url.slice(0, q);
    if (raw !== '/' && raw !== '/web' && !raw.startsWith(WEB_PREFIX)) return false;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      this.error(req, res, 'GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method} is not allowed on ${raw}`, 'The Web UI is read with GET.', { allow: 'GET, HEAD' });
      return true;
    }
    if (raw === '/' || raw === '/web') {
      this.send(res, req, 302, { location: `${WEB_PREFIX}${q < 0 ? '' : url.slice(q)}`, 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' }, Buffer.from(`see ${WEB_PREFIX}\n`));
      return true;
    }
    const checked = staticPathOf(raw);
    if ('refused' in checked) {
      this.error(req, res, 'GW_ERR_API_BAD_REQUEST', `bad path: ${checked.refused}`, 'Ask for the Web UI at /web/.');
      return true;
    }
    if (!this.index) {
      this.unbuilt(req, res);
      return true;
    }
    const path = checked.path === WEB_PREFIX ? INDEX : checked.path;
    let entry = this.index.get(path);
    if (!entry && path.startsWith(ASSETS_PREFIX)) {
      this.error(req, res, 'GW_ERR_API_NOT_FOUND', `no such file of the Web UI: ${path}`, 'The Web UI was probably updated: reload the page.');
      return true;
    }
    entry ??= this.index.get(INDEX)!;
    void this.serve(req, res, entry);
    return true;
  }

  private async serve(req: IncomingMessage, res: ServerResponse, entry: Entry): Promise<void> {
    const accepted = acceptedEncodings(headerOf(req, 'accept-encoding'));
    const encoding = accepted.find((e) => entry.variants[e] !== undefined);
    let body: Body;
    try {
      body = await this.body(entry, encoding);
    } catch {
      this.error(req, res, 'GW_ERR_API_NOT_FOUND', 'this file of the Web UI is gone from the disk', 'The Web UI was rebuilt while the Proxy runs: restart the Proxy.');
      return;
    }
    const headers: Record<string, string> = { 'content-type': entry.type, 'cache-control': entry.cache, etag: body.etag };
    if (Object.keys(entry.variants).length > 0) headers.vary = 'accept-encoding';
    if (encoding) headers['content-encoding'] = encoding;
    if (matchesEtag(headerOf(req, 'if-none-match'), body.etag)) return this.send(res, req, 304, headers, Buffer.alloc(0));
    this.send(res, req, 200, headers, body.bytes);
  }

  private body(entry: Entry, encoding: Encoding | undefined): Promise<Body> {
    const key = encoding ?? 'identity';
    let p = entry.loaded.get(key);
    if (!p) {
      const file = encoding ? entry.variants[encoding]! : entry.file;
      p = readFile(file).then((bytes) => ({ bytes, etag: `"${createHash('sha256').update(bytes).digest('base64url').slice(0, 22)}${encoding ? `-${encoding}` : ''}"` }));
      p.catch(() => entry.loaded.delete(key));
      entry.loaded.set(key, p);
    }
    return p;
  }

  private unbuilt(req: IncomingMessage, res: ServerResponse): void {
    const page = `<!doctype html><meta charset="utf-8"><title>Web UI not built</title><p>The Web UI of this gateway is not built: run <code>npm run build</code> (it writes ${escapeHtml(this.root)}) and restart the Proxy.</p>\n`;
    this.send(res, req, 503, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' }, Buffer.from(page));
  }

  private error(req: IncomingMessage, res: ServerResponse, code: ErrorCode, message: string, hint: string, extra: Record<string, string> = {}): void {
    const body = Buffer.from(JSON.stringify({ error: { code, message, hint } }));
    this.send(res, req, httpStatus(code), { 'content-type': 'application/json', 'cache-control': 'no-store', ...extra }, body);
  }

  private send(res: ServerResponse, req: IncomingMessage, status: number, headers: Record<string, string>, body: Buffer): void {
    if (res.headersSent || res.destroyed) return;
    res.writeHead(status, { ...this.headers, ...headers, ...(status === 304 ? {} : { 'content-length': String(body.length) }) });
    res.end(req.method === 'HEAD' || status === 304 ? undefined : body);
  }
}

function headerOf(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v.join(', ') : v;
}

function matchesEtag(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  return header
    .slice(0, 4096)
    .split(',')
    .some((t) => {
      const tag = t.trim();
      return tag === '*' || tag === etag || tag === `W/${etag}`;
    });
}

