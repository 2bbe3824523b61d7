/**
 * The Proxy's relay of release artifacts (src/proxy/artifacts.ts), mounted in a real http server on loopback and
 * asked with node's http client (paths sent exactly as written) and curl. The upstream is a plain http server whose
 * name exists only in the hosts file of a real squid, the corporate proxy on the Proxy's side: a direct dial could
 * not reach it. The upstream counts what it is asked, so "served from the cache" is shown by its count, not assumed.
 *
 * Hostile: paths with "..", %2e%2e, %2f, queries, 10 KB paths, other names; an upstream that never answers (the
 * deadline), one that closes early (the client cut, nothing cached), a flood of requests for one file (one upstream
 * fetch), the cache over its cap (least recently used evicted), an index past its TTL (fetched again).
 */
import { chmod, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/parse.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ArtifactRelay, CACHE_HEADER, type ArtifactRelayOptions } from '../../src/proxy/artifacts.js';
import { ArtifactPathError, parseArtifactPath } from '../../src/wire/artifacts.js';
import { pseudoRandomBytes, startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';

setRootLogger(createLogger({ level: 'silent' }));

const UPSTREAM_IP = '127.0.0.3';
const UPSTREAM = 'releases.gw.test';
const TARBALL = 'gateway-ent-v17.0.1-linux-amd64-bin.tar.gz';

let dir: string;
let squid: Squid;
let upstream: HttpTestServer;
/** What the upstream was asked, by path. */
const asked = new Map<string, number>();
/** Per path: how the upstream answers (default: 404). */
const files = new Map<string, (res: http.ServerResponse) => void>();
const cleanups: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-artifacts-'));
  await chmod(dir, 0o755); // squid (the proxy user) reads the hosts file
  const hostsFile = join(dir, 'hosts');
  await writeFile(hostsFile, `${UPSTREAM_IP} ${UPSTREAM}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${hostsFile}`] });
  upstream = await startHttpServer((req, res) => {
    const path = req.url ?? '/';
    asked.set(path, (asked.get(path) ?? 0) + 1);
    const answer = files.get(path);
    if (answer) return answer(res);
    res.writeHead(404).end('no such file');
  }, UPSTREAM_IP);
});

afterAll(async () => {
  await Promise.allSettled(cleanups.reverse().map((c) => c()));
  await upstream?.close();
  await squid?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

function serveBytes(path: string, body: Buffer, type = 'application/octet-stream'): void {
  files.set(path, (res) => res.writeHead(200, { 'content-type': type, 'content-length': body.length }).end(body));
}

let n = 0;
async function mount(options: Partial<ArtifactRelayOptions> = {}): Promise<{ relay: ArtifactRelay; web: HttpTestServer; cacheDir: string }> {
  const cacheDir = join(dir, `cache-${++n}`);
  const relay = new ArtifactRelay({
    downloadUrl: `http://${UPSTREAM}:${upstream.port}/releases`,
    repoUrl: `http://${UPSTREAM}:${upstream.port}/repo`,
    cacheDir,
    cacheMaxBytes: 64 * 1024 ** 2,
    fetchTimeoutMs: 10_000,
    fetchDeadlineMs: 60_000,
    indexTtlMs: 60_000,
    maxFetches: 16,
    dialer: new Dialer({ env: { HTTPS_PROXY: squid.url, HTTP_PROXY: squid.url }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000 }),
    ...options,
  });
  const web = await startHttpServer((req, res) => {
    if (relay.handle(req, res)) return;
    res.writeHead(418).end('not the relay');
  });
  cleanups.push(() => web.close());
  return { relay, web, cacheDir };
}

interface Got {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  /** The connection was cut before the end of the body. */
  cut: boolean;
}

/** GET (or another method) with the path exactly as written. */
function get(web: HttpTestServer, path: string, method = 'GET'): Promise<Got> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: web.port, path, method, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      let cut = false;
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('aborted', () => (cut = true));
      res.on('error', () => (cut = true));
      res.on('close', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks), cut: cut || !res.complete }));
    });
    req.on('error', reject);
    req.end();
  });
}

const code = (g: Got): string => (JSON.parse(g.body.toString('utf8')) as { error: { code: string } }).error.code;

describe('the path grammar (src/wire/artifacts.ts)', () => {
  it('takes release tarball names and their .sha256, and repository paths, deciding what is immutable', () => {
    expect(parseArtifactPath(`/v1/webapi/autoupdate/artifacts/${TARBALL}`)).toEqual({ route: 'artifacts', path: TARBALL, immutable: true });
    expect(parseArtifactPath(`/v1/webapi/autoupdate/artifacts/${TARBALL}.sha256`)?.immutable).toBe(true);
    expect(parseArtifactPath('/v1/webapi/autoupdate/artifacts/gateway-ent-v17.1.0-rc.1-linux-arm64-fips-bin.tar.gz')?.route).toBe('artifacts');
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/debian/dists/bookworm/InRelease')).toEqual({ route: 'repo', path: 'debian/dists/bookworm/InRelease', immutable: false });
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/debian/pool/stable/v17/g/gateway/gateway_17.1.0%7erc.1_amd64.deb')).toEqual({
      route: 'repo',
      path: 'debian/pool/stable/v17/g/gateway/gateway_17.1.0~rc.1_amd64.deb',
      immutable: true,
    });
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/debian/dists/bookworm/stable/v17/binary-amd64/by-hash/SHA256/' + 'a'.repeat(64))?.immutable).toBe(true);
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/rhel/9/repodata/' + 'b'.repeat(64) + '-primary.xml.gz')?.immutable).toBe(true);
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/rhel/9/repodata/repomd.xml')?.immutable).toBe(false);
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/debian/pool/main/g/gateway/gateway_17.0.1.dsc')?.immutable).toBe(true);
    expect(parseArtifactPath('/v1/webapi/autoupdate/repo/debian/dists/bookworm/stable/v17/binary-amd64/Packages.gz')?.immutable).toBe(false);
    expect(parseArtifactPath('/v1/webapi/autoupdate/agent')).toBeUndefined();
    expect(parseArtifactPath('/v1/webapi/autoupdate/artifactsX/a')).toBeUndefined();
  });

  it.each([
    ['/v1/webapi/autoupdate/repo/debian/../../etc/passwd', '"." or ".."'],
    ['/v1/webapi/autoupdate/repo/debian/%2e%2e/%2e%2e/etc/passwd', '"." or ".."'],
    ['/v1/webapi/autoupdate/repo/debian/%2E%2E', '"." or ".."'],
    ['/v1/webapi/autoupdate/repo/debian/..%2f..%2fetc', 'characters'],
    ['/v1/webapi/autoupdate/repo/debian/.hidden', 'starts with "."'],
    ['/v1/webapi/autoupdate/repo/debian//InRelease', 'empty segment'],
    ['/v1/webapi/autoupdate/repo/debian/InRelease?x=1', 'query'],
    ['/v1/webapi/autoupdate/repo/debian/%zz', 'percent-encoding'],
    ['/v1/webapi/autoupdate/repo/debian/a%00b', 'characters'],
    [`/v1/webapi/autoupdate/repo/${'a/'.repeat(20)}b`, 'segments'],
    ['/v1/webapi/autoupdate/repo/' + 'a'.repeat(10 * 1024), 'characters long'],
    ['/v1/webapi/autoupdate/artifacts/gateway-ent-v17.0.1-linux-amd64-bin.tar.gz.asc', 'not a release tarball name'],
    ['/v1/webapi/autoupdate/artifacts/sub/' + TARBALL, 'not a release tarball name'],
    ['/v1/webapi/autoupdate/artifacts/', 'names no file'],
  ].map(([path, why]) => [why!, path!]))('refuses a path (%s)', (why, path) => {
    expect(() => parseArtifactPath(path)).toThrow(ArtifactPathError);
    expect(() => parseArtifactPath(path)).toThrow(why);
  });
});

describe('proxy_service.autoupdate_artifacts', () => {
  const parse = (body: string) => parseConfig(`proxy_service:\n  autoupdate_artifacts:\n${body}`, 'gateway.yaml').proxy_service.autoupdate_artifacts;

  it('defaults: nothing relayed, an 8 GiB cache in the data directory, 30 s, 60 s, 16 fetches', () => {
    expect(parse('    {}\n')).toEqual({ download_url: undefined, repo_url: undefined, cache_dir: undefined, cache_max_bytes: 8 * 1024 ** 3, fetch_timeout: 30_000, fetch_deadline: 3_600_000, index_ttl: 60_000, max_fetches: 16 });
    expect(parse('    download_url: https://CDN.example.com:443/\n    repo_url: http://mirror.example:8080/gateway\n').download_url).toBe('https://cdn.example.com');
  });

  it.each([
    ['    download_url: https://user:secret@cdn.example.com\n', 'without a user name or password'],
    ['    repo_url: ftp://mirror.example\n', 'an http:// or https:// URL'],
    ['    repo_url: https://mirror.example/?token=x\n', 'without a query'],
    ['    cache_max_bytes: 1000\n', '1048576'],
    ['    cache_dir: relative/dir\n', 'absolute'],
    ['    max_fetches: 0\n', '1 to 256'],
  ])('refuses %s', (body, why) => {
    expect(() => parse(body)).toThrow(why);
    // The password never appears in the error.
    try {
      parse(body);
    } catch (err) {
      expect(String((err as Error).message)).not.toContain('secret');
    }
  });
});

describe('the relay, through squid to its upstream', () => {
  it('refuses hostile paths with GW_ERR_ARTIFACT_BAD_PATH before anything is fetched, and other methods with 405', async () => {
    const { web } = await mount();
    const before = [...asked.values()].reduce((a, b) => a + b, 0);
    for (const path of [
      '/v1/webapi/autoupdate/repo/../../../etc/passwd',
      '/v1/webapi/autoupdate/repo/%2e%2e/%2e%2e/etc/passwd',
      '/v1/webapi/autoupdate/repo/debian/InRelease?redirect=http://evil',
      `/v1/webapi/autoupdate/repo/${'x'.repeat(10 * 1024)}`,
      '/v1/webapi/autoupdate/artifacts/..%2f..%2fetc%2fpasswd',
      '/v1/webapi/autoupdate/artifacts/evil.sh',
    ]) {
      const g = await get(web, path);
      expect(g.status, path).toBe(400);
      expect(code(g), path).toBe('GW_ERR_ARTIFACT_BAD_PATH');
    }
    const post = await get(web, `/v1/webapi/autoupdate/artifacts/${TARBALL}`, 'POST');
    expect(post.status).toBe(405);
    expect(post.headers.allow).toBe('GET, HEAD');
    expect([...asked.values()].reduce((a, b) => a + b, 0)).toBe(before);
    // Not its paths: the web server's other routes get them.
    expect((await get(web, '/v1/webapi/autoupdate/agent')).status).toBe(418);
  });

  it('relays a tarball and caches it: the second request does not reach the upstream, byte for byte the same', async () => {
    const { relay, web } = await mount();
    const body = pseudoRandomBytes(3 * 1024 * 1024 + 17, 5);
    const name = 'gateway-ent-v17.0.2-linux-amd64-bin.tar.gz';
    serveBytes(`/releases/${name}`, body, 'application/gzip');
    const first = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(first.status).toBe(200);
    expect(first.headers[CACHE_HEADER]).toBe('miss');
    expect(first.headers['content-length']).toBe(String(body.length));
    expect(first.headers['content-type']).toBe('application/gzip');
    expect(first.body.equals(body)).toBe(true);
    const second = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(second.headers[CACHE_HEADER]).toBe('hit');
    expect(second.body.equals(body)).toBe(true);
    const head = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`, 'HEAD');
    expect(head.status).toBe(200);
    expect(head.headers['content-length']).toBe(String(body.length));
    expect(asked.get(`/releases/${name}`)).toBe(1);
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('artifacts', name)).toBe(true);
    // The upstream was reached through squid (its access log names the CONNECT), never directly.
    expect((await squid.readAccessLog()).some((l) => l.includes(`${UPSTREAM}:${upstream.port}`))).toBe(true);
  });

  it('passes the upstream 404 on as GW_ERR_ARTIFACT_NOT_FOUND and caches nothing', async () => {
    const { relay, web } = await mount();
    const g = await get(web, '/v1/webapi/autoupdate/artifacts/gateway-ent-v99.0.0-linux-amd64-bin.tar.gz');
    expect(g.status).toBe(404);
    expect(code(g)).toBe('GW_ERR_ARTIFACT_NOT_FOUND');
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('artifacts', 'gateway-ent-v99.0.0-linux-amd64-bin.tar.gz')).toBe(false);
  });

  it('answers GW_ERR_ARTIFACT_DISABLED when no upstream is configured for the route', async () => {
    const { web } = await mount({ downloadUrl: undefined });
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${TARBALL}`);
    expect(g.status).toBe(404);
    expect(code(g)).toBe('GW_ERR_ARTIFACT_DISABLED');
  });

  it('a flood of requests for one file makes one upstream fetch, and every client gets the whole file', async () => {
    const { web } = await mount();
    const body = pseudoRandomBytes(2 * 1024 * 1024, 9);
    const name = 'gateway-ent-v17.0.3-linux-amd64-bin.tar.gz';
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    // The upstream answers only once every request has arrived at the relay: they all find the fetch under way.
    files.set(`/releases/${name}`, (res) => {
      res.writeHead(200, { 'content-length': body.length });
      res.write(body.subarray(0, 1024));
      void gate.then(() => res.end(body.subarray(1024)));
    });
    const flood = Array.from({ length: 40 }, () => get(web, `/v1/webapi/autoupdate/artifacts/${name}`));
    await waitUntil(() => (asked.get(`/releases/${name}`) ?? 0) >= 1);
    release();
    const got = await Promise.all(flood);
    for (const g of got) {
      expect(g.status).toBe(200);
      expect(g.body.equals(body)).toBe(true);
    }
    expect(asked.get(`/releases/${name}`)).toBe(1);
    expect(got.filter((g) => g.headers[CACHE_HEADER] === 'miss')).toHaveLength(1);
  });

  it('a client that goes away mid-download does not stop the fetch: the whole file is cached for the next one', async () => {
    const { relay, web } = await mount();
    const body = pseudoRandomBytes(1024 * 1024, 12);
    const name = 'gateway-ent-v17.0.9-linux-amd64-bin.tar.gz';
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    files.set(`/releases/${name}`, (res) => {
      res.writeHead(200, { 'content-length': body.length });
      res.write(body.subarray(0, 4096));
      void gate.then(() => res.end(body.subarray(4096)));
    });
    await new Promise<void>((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port: web.port, path: `/v1/webapi/autoupdate/artifacts/${name}`, agent: false }, (res) => {
        res.once('data', () => {
          req.destroy(); // gone after the first bytes
          resolve();
        });
      });
      req.on('error', () => undefined);
      req.on('close', () => resolve());
      setTimeout(() => reject(new Error('no first bytes')), 10_000).unref();
    });
    release();
    await waitUntil(() => relay.isCached('artifacts', name));
    const next = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(next.headers[CACHE_HEADER]).toBe('hit');
    expect(next.body.equals(body)).toBe(true);
    expect(asked.get(`/releases/${name}`)).toBe(1);
  });

  it('an upstream that closes early: every client is cut, nothing is cached, the next request fetches again', async () => {
    const { relay, web, cacheDir } = await mount();
    const name = 'gateway-ent-v17.0.4-linux-amd64-bin.tar.gz';
    files.set(`/releases/${name}`, (res) => {
      res.writeHead(200, { 'content-length': 1_000_000 });
      res.write(pseudoRandomBytes(300_000, 3), () => setImmediate(() => res.socket?.destroy()));
    });
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(g.status).toBe(200);
    expect(g.cut).toBe(true);
    expect(g.body.length).toBeLessThan(1_000_000);
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('artifacts', name)).toBe(false);
    await waitUntil(async () => (await readdir(join(cacheDir, 'tmp'))).length === 0);
    expect((await readdir(cacheDir)).filter((f) => f !== 'tmp')).toEqual([]);
    await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(asked.get(`/releases/${name}`)).toBe(2);
  });

  it('an upstream that never answers fails at fetch_timeout with GW_ERR_ARTIFACT_UPSTREAM_TIMEOUT', async () => {
    const { web } = await mount({ fetchTimeoutMs: 500 });
    const name = 'gateway-ent-v17.0.5-linux-amd64-bin.tar.gz';
    files.set(`/releases/${name}`, () => undefined); // holds the request, answers nothing
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(g.status).toBe(504);
    expect(code(g)).toBe('GW_ERR_ARTIFACT_UPSTREAM_TIMEOUT');
  });

  it('an upstream that stalls mid-body: the client is cut at fetch_timeout, nothing is cached', async () => {
    const { relay, web } = await mount({ fetchTimeoutMs: 500 });
    const name = 'gateway-ent-v17.0.6-linux-amd64-bin.tar.gz';
    files.set(`/releases/${name}`, (res) => {
      res.writeHead(200, { 'content-length': 100_000 });
      res.write(Buffer.alloc(10_000)); // and then nothing
    });
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(g.cut).toBe(true);
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('artifacts', name)).toBe(false);
  });

  it('an upstream that trickles a byte now and then, never idle for fetch_timeout: cut at the overall deadline, nothing cached', async () => {
    const { relay, web } = await mount({ fetchTimeoutMs: 5_000, fetchDeadlineMs: 800 });
    const name = 'gateway-ent-v17.0.10-linux-amd64-bin.tar.gz';
    const timers: NodeJS.Timeout[] = [];
    files.set(`/releases/${name}`, (res) => {
      res.writeHead(200, { 'content-length': 1_000 });
      const t = setInterval(() => (res.destroyed ? clearInterval(t) : res.write('x')), 100);
      timers.push(t);
    });
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    for (const t of timers) clearInterval(t);
    expect(g.cut).toBe(true);
    expect(g.body.length).toBeLessThan(1_000);
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('artifacts', name)).toBe(false);
  });

  it('an upstream that trickles its headers: the overall deadline answers GW_ERR_ARTIFACT_UPSTREAM_TIMEOUT', async () => {
    const { web } = await mount({ fetchTimeoutMs: 5_000, fetchDeadlineMs: 500 });
    const name = 'gateway-ent-v17.0.11-linux-amd64-bin.tar.gz';
    files.set(`/releases/${name}`, () => undefined);
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(g.status).toBe(504);
    expect(code(g)).toBe('GW_ERR_ARTIFACT_UPSTREAM_TIMEOUT');
    expect(g.body.toString()).toContain("the fetch's overall deadline");
  });

  it('a body larger than an artifact may be is cut and not cached', async () => {
    const { relay, web } = await mount({ maxFileBytes: 100_000 });
    const name = 'gateway-ent-v17.0.7-linux-amd64-bin.tar.gz';
    files.set(`/releases/${name}`, (res) => res.writeHead(200, { 'content-length': 10 ** 12 }).end());
    const big = await get(web, `/v1/webapi/autoupdate/artifacts/${name}`);
    expect(big.status).toBe(502);
    expect(code(big)).toBe('GW_ERR_ARTIFACT_UPSTREAM');
    const chunked = 'gateway-ent-v17.0.8-linux-amd64-bin.tar.gz';
    files.set(`/releases/${chunked}`, (res) => {
      res.writeHead(200); // no length: chunked, longer than allowed
      res.end(Buffer.alloc(300_000));
    });
    const g = await get(web, `/v1/webapi/autoupdate/artifacts/${chunked}`);
    expect(g.cut).toBe(true);
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('artifacts', chunked)).toBe(false);
  });

  it('over its cap, the cache evicts the least recently used file', async () => {
    const { relay, web } = await mount({ cacheMaxBytes: 1024 * 1024 });
    const names = ['a', 'b', 'c', 'd'].map((x, i) => `gateway-ent-v17.1.${i}-linux-amd64-bin.tar.gz`);
    for (const [i, name] of names.entries()) serveBytes(`/releases/${name}`, pseudoRandomBytes(400 * 1024, 20 + i));
    // The relay commits a finished fetch just after its last byte went out: wait for that before the next.
    const fetch = async (i: number) => {
      const r = await get(web, `/v1/webapi/autoupdate/artifacts/${names[i]}`);
      await relay.settled();
      return r;
    };
    await fetch(0);
    await fetch(1);
    await fetch(2); // 1.2 MB: a goes
    expect(names.map((x) => relay.isCached('artifacts', x))).toEqual([false, true, true, false]);
    expect((await fetch(1)).headers[CACHE_HEADER]).toBe('hit'); // b is now the most recently used
    await fetch(3); // c goes, not b
    expect(names.map((x) => relay.isCached('artifacts', x))).toEqual([false, true, false, true]);
    expect(relay.cachedBytes()).toBeLessThanOrEqual(1024 * 1024);
  });

  it('an index is served from the cache only for index_ttl, a package by name for good', async () => {
    let now = 1_000_000;
    const { web } = await mount({ clock: () => now, indexTtlMs: 60_000 });
    serveBytes('/repo/debian/dists/bookworm/InRelease', Buffer.from('signed index v1'), 'text/plain');
    serveBytes('/repo/debian/pool/g/gateway_17.0.1_amd64.deb', Buffer.from('a package'));
    const index = () => get(web, '/v1/webapi/autoupdate/repo/debian/dists/bookworm/InRelease');
    const deb = () => get(web, '/v1/webapi/autoupdate/repo/debian/pool/g/gateway_17.0.1_amd64.deb');
    expect((await index()).headers['cache-control']).toBe('no-cache');
    expect((await deb()).headers['cache-control']).toContain('immutable');
    expect((await index()).headers[CACHE_HEADER]).toBe('hit');
    now += 61_000;
    serveBytes('/repo/debian/dists/bookworm/InRelease', Buffer.from('signed index v2'), 'text/plain');
    const fresh = await index();
    expect(fresh.headers[CACHE_HEADER]).toBe('miss');
    expect(fresh.body.toString()).toBe('signed index v2');
    expect((await deb()).headers[CACHE_HEADER]).toBe('hit');
    expect(asked.get('/repo/debian/dists/bookworm/InRelease')).toBe(2);
    expect(asked.get('/repo/debian/pool/g/gateway_17.0.1_amd64.deb')).toBe(1);
  });

  it('a restart keeps immutable files and drops indices', async () => {
    const { relay, web, cacheDir } = await mount();
    serveBytes('/repo/debian/dists/x/InRelease', Buffer.from('index'));
    serveBytes('/repo/debian/pool/x/gateway_17.0.9_amd64.deb', Buffer.from('deb bytes'));
    await get(web, '/v1/webapi/autoupdate/repo/debian/dists/x/InRelease');
    await get(web, '/v1/webapi/autoupdate/repo/debian/pool/x/gateway_17.0.9_amd64.deb');
    await relay.settled(); // the relay commits a fetch just after its last byte went out
    expect(relay.isCached('repo', 'debian/dists/x/InRelease')).toBe(true); // cached before the restart, dropped by it
    const again = await mount({ cacheDir });
    expect(again.relay.isCached('repo', 'debian/pool/x/gateway_17.0.9_amd64.deb')).toBe(true);
    expect(again.relay.isCached('repo', 'debian/dists/x/InRelease')).toBe(false);
  });

  it('more different files at once than max_fetches: the extra one is refused with GW_ERR_ARTIFACT_BUSY', async () => {
    const { web } = await mount({ maxFetches: 1 });
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    files.set('/repo/busy/one.deb', (res) => void gate.then(() => res.writeHead(200, { 'content-length': 3 }).end('one')));
    const first = get(web, '/v1/webapi/autoupdate/repo/busy/one.deb');
    await waitUntil(() => (asked.get('/repo/busy/one.deb') ?? 0) >= 1);
    const second = await get(web, '/v1/webapi/autoupdate/repo/busy/two.deb');
    expect(second.status).toBe(503);
    expect(code(second)).toBe('GW_ERR_ARTIFACT_BUSY');
    release();
    expect((await first).body.toString()).toBe('one');
  });
});

async function waitUntil(check: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error('condition not met within 10 s');
}
