/**
 * The version server, mounted in a real http server on loopback and asked with curl (a child process) and node's
 * http client. forward_url channels reach their upstream (a second VersionServer behind https with a test CA, or a
 * plain http server) THROUGH a real squid: the upstream names exist only in squid's hosts file, so a direct dial
 * could not reach them by accident.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { VersionServer, parsePath, type VersionServerOptions } from '../../src/proxy/versions.js';
import { VERSION } from '../../src/version.js';
import { startHttpServer, startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { curlHead } from '../helpers/curl.js';

setRootLogger(createLogger({ level: 'silent' }));

const PREFIX = '/v1/webapi/automaticupgrades/channel';
const UPSTREAM_IP = '127.0.0.3';
const NAMES = ['upstream.gw.test', 'plain.gw.test', 'flaky.gw.test', 'down.gw.test'];

let dir: string;
let pki: TestPki;
let squid: Squid;
const cleanups: Array<() => Promise<unknown>> = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-versions-'));
  await chmod(dir, 0o755);
  const hostsFile = join(dir, 'hosts');
  await writeFile(hostsFile, `${UPSTREAM_IP} ${NAMES.join(' ')}\n`, { mode: 0o644 });
  pki = await makeTestPki();
  squid = await startSquid({ extraConfig: [`hosts_file ${hostsFile}`] });
});

afterAll(async () => {
  await Promise.allSettled(cleanups.reverse().map((c) => c()));
  await squid?.stop();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

// --- helpers -------------------------------------------------------------------------------------------------------

/** A Dialer that sends everything (https:// and http:// targets) through squid. */
function squidDialer(extra: Record<string, string> = {}, options: ConstructorParameters<typeof Dialer>[0] = {}): Dialer {
  return new Dialer({ env: { HTTPS_PROXY: squid.url, HTTP_PROXY: squid.url, ...extra }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000, ...options });
}

/** Mounts the version server in a real http server; paths it does not own get 418 from the "web server". */
async function mount(options: Partial<VersionServerOptions> & Pick<VersionServerOptions, 'channels'>): Promise<{ vs: VersionServer; web: HttpTestServer }> {
  const vs = new VersionServer({ ownVersion: VERSION, dialer: squidDialer(), ...options });
  const web = await startHttpServer((req, res) => {
    if (vs.handle(req, res)) return;
    res.writeHead(418, { 'content-type': 'text/plain' });
    res.end('not the version server');
  });
  cleanups.push(() => web.close());
  return { vs, web };
}

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** curl -i, parsed. --path-as-is keeps "..", "//" and the like exactly as written. */
async function curl(url: string, ...args: string[]): Promise<Answer> {
  const { status, headers, rest } = await curlHead(['--path-as-is', ...args, url]);
  return { status, headers, body: rest };
}

/** node's http client, one connection per request. */
function get(url: string, method = 'GET'): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(res.headers)) headers[k] = Array.isArray(v) ? v.join(', ') : String(v);
        resolve({ status: res.statusCode ?? 0, headers, body: Buffer.concat(chunks).toString() });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

function errorCode(a: Answer): string {
  expect(a.headers['content-type']).toBe('application/json');
  const parsed = JSON.parse(a.body) as { error: { code: string; message: string; hint: string } };
  expect(parsed.error.message.length).toBeGreaterThan(0);
  expect(parsed.error.hint.length).toBeGreaterThan(0);
  return parsed.error.code;
}

function expectNoStore(a: Answer): void {
  expect(a.headers['cache-control']).toBe('no-store');
  expect(a.headers['pragma']).toBe('no-cache');
}

async function rejectsWith(p: Promise<unknown>, code: string): Promise<GatewayError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe(code);
    return err as GatewayError;
  }
  throw new Error(`expected ${code}, but it resolved`);
}

type Mode = 'ok' | 'garbage' | 'none' | '500' | 'slow' | 'html';

/** A plain http upstream on UPSTREAM_IP that counts requests per path and can be switched between behaviours. */
async function flakyUpstream(initial: { version: string; critical: string }) {
  const state = { mode: 'ok' as Mode, delayMs: 0, ...initial, hits: new Map<string, number>() };
  const server = await startHttpServer((req, res) => {
    const path = req.url ?? '/';
    state.hits.set(path, (state.hits.get(path) ?? 0) + 1);
    const answer = path.endsWith('/critical') ? state.critical : state.version;
    const reply = () => {
      switch (state.mode) {
        case 'ok':
          return res.end(answer);
        case 'garbage':
          return res.end(path.endsWith('/critical') ? 'maybe\n' : 'vv1.2.3\n');
        case 'none':
          return res.end('none');
        case 'html':
          res.writeHead(200, { 'content-type': 'text/html' });
          return res.end('<html><body>Access denied by corporate policy</body></html>');
        case '500':
          res.writeHead(500);
          return res.end(answer); // a good-looking body with an error status is still a failure
        case 'slow':
          return undefined; // never answers
      }
    };
    if (state.delayMs > 0) setTimeout(reply, state.delayMs);
    else reply();
  }, UPSTREAM_IP);
  cleanups.push(() => server.close());
  const hits = (what: 'version' | 'critical') => [...state.hits.entries()].filter(([p]) => p.endsWith(`/${what}`)).reduce((n, [, c]) => n + c, 0);
  return { server, state, hits };
}

// --- channels served locally ---------------------------------------------------------------------------------------

describe('local channels', () => {
  let web: HttpTestServer;
  let vs: VersionServer;
  beforeAll(async () => {
    ({ vs, web } = await mount({
      channels: {
        'stable/v14': { static_version: 'v14.3.7' },
        'stable/rolling': { static_version: 'v15.1.3' },
        'edge': { static_version: 'v17.1.0-beta.2+build.7' },
      },
    }));
  });

  it('default serves the proxy\'s own version with a leading v, as text/plain without caching', async () => {
    for (const a of [await curl(`${web.url}${PREFIX}/default/version`), await get(`${web.url}${PREFIX}/default/version`)]) {
      expect(a.status).toBe(200);
      expect(a.body).toBe(`v${VERSION}`);
      expect(a.body).toBe('v17.0.0-dev');
      expect(a.headers['content-type']).toBe('text/plain; charset=utf-8');
      expectNoStore(a);
    }
    const critical = await curl(`${web.url}${PREFIX}/default/critical`);
    expect(critical.status).toBe(200);
    expect(critical.body).toBe('no');
    expectNoStore(critical);
  });

  it('serves channels whose names contain "/" (the last segment is the request type)', async () => {
    expect((await curl(`${web.url}${PREFIX}/stable/v14/version`)).body).toBe('v14.3.7');
    expect((await curl(`${web.url}${PREFIX}/stable/rolling/version`)).body).toBe('v15.1.3');
    expect((await get(`${web.url}${PREFIX}/stable/rolling/critical`)).body).toBe('no');
    expect((await get(`${web.url}${PREFIX}/edge/version`)).body).toBe('v17.1.0-beta.2+build.7');
  });

  it('decodes the path exactly once', async () => {
    expect((await curl(`${web.url}${PREFIX}/stable%2Fv14/version`)).body).toBe('v14.3.7');
    expect((await curl(`${web.url}${PREFIX}/d%65fault/versio%6E`)).body).toBe('v17.0.0-dev');
    const twice = await curl(`${web.url}${PREFIX}/stable%252Fv14/version`); // decodes to the name "stable%2Fv14"
    expect(twice.status).toBe(404);
    expect(errorCode(twice)).toBe('GW_ERR_VERSION_UNKNOWN_CHANNEL');
  });

  it('answers 404 JSON for an unknown channel (also for a prefix of a configured one)', async () => {
    for (const channel of ['nope', 'stable', 'stable/v13', 'Default', '__proto__', 'constructor']) {
      const a = await curl(`${web.url}${PREFIX}/${channel}/version`);
      expect(a.status, channel).toBe(404);
      expect(errorCode(a)).toBe('GW_ERR_VERSION_UNKNOWN_CHANNEL');
      expectNoStore(a);
    }
    expect(JSON.parse((await get(`${web.url}${PREFIX}/nope/critical`)).body).error.message).toContain('"nope"');
  });

  it('refuses empty, "." and ".." segments, bad encodings and missing suffixes with 400 JSON naming the valid paths', async () => {
    const bad = [
      `${PREFIX}//version`,
      `${PREFIX}/a/../b/version`,
      `${PREFIX}/stable/../stable/v14/version`,
      `${PREFIX}/./default/version`,
      `${PREFIX}/%2e%2e/default/version`,
      `${PREFIX}/stable//v14/version`,
      `${PREFIX}/default/version/`,
      `${PREFIX}/default//version`,
      `${PREFIX}/stable/v14`, // no suffix: the last segment is taken as the request type
      `${PREFIX}/default`,
      `${PREFIX}/default/versions`,
      `${PREFIX}/version`, // no channel
      `${PREFIX}/`,
      PREFIX,
      `${PREFIX}/%zz/version`,
    ];
    for (const path of bad) {
      const a = await curl(`${web.url}${path}`);
      expect(a.status, path).toBe(400);
      expect(errorCode(a), path).toBe('GW_ERR_VERSION_BAD_PATH');
      expect(JSON.parse(a.body).error.message, path).toContain('/channel/<channel>/version');
      expectNoStore(a);
    }
  });

  it('leaves other paths to the web server', async () => {
    for (const path of ['/webapi/ping', '/v1/webapi/automaticupgrades/channelx/default/version', '/v1/webapi/automaticupgrades', '/V1/webapi/automaticupgrades/channel/default/version']) {
      const a = await curl(`${web.url}${path}`);
      expect(a.status, path).toBe(418);
    }
  });

  it('ignores the query string', async () => {
    expect((await curl(`${web.url}${PREFIX}/default/version?agent=x&v=1`)).body).toBe('v17.0.0-dev');
  });

  it('HEAD answers the same status and headers as GET, without a body', async () => {
    for (const path of [`${PREFIX}/stable/v14/version`, `${PREFIX}/default/critical`, `${PREFIX}/nope/version`, `${PREFIX}//version`]) {
      const g = await get(`${web.url}${path}`);
      const h = await get(`${web.url}${path}`, 'HEAD');
      expect(h.status, path).toBe(g.status);
      expect(h.body).toBe('');
      for (const k of ['content-type', 'content-length', 'cache-control', 'pragma']) expect(h.headers[k], `${path} ${k}`).toBe(g.headers[k]);
      const c = await curl(`${web.url}${path}`, '-I');
      expect(c.status).toBe(g.status);
      expect(c.body).toBe('');
      expectNoStore(c);
    }
  });

  it('answers 405 with Allow: GET, HEAD for other methods', async () => {
    for (const method of ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) {
      const a = await curl(`${web.url}${PREFIX}/default/version`, '-X', method);
      expect(a.status, method).toBe(405);
      expect(a.headers['allow']).toBe('GET, HEAD');
      expect(errorCode(a)).toBe('GW_ERR_API_METHOD_NOT_ALLOWED');
      expectNoStore(a);
    }
    const withBody = await curl(`${web.url}${PREFIX}/default/version`, '-X', 'POST', '--data', 'x=1');
    expect(withBody.status).toBe(405);
  });

  it('resolve() gives the same answers without HTTP', async () => {
    expect(await vs.resolve('default', 'version')).toBe('v17.0.0-dev');
    expect(await vs.resolve('stable/v14', 'version')).toBe('v14.3.7');
    expect(await vs.resolve('stable/v14', 'critical')).toBe('no');
    await rejectsWith(vs.resolve('nope', 'version'), 'GW_ERR_VERSION_UNKNOWN_CHANNEL');
    await rejectsWith(vs.resolve('default', 'latest' as 'version'), 'GW_ERR_VERSION_BAD_PATH');
    expect(vs.channelNames().sort()).toEqual(['default', 'edge', 'stable/rolling', 'stable/v14']);
  });
});

describe('configuration', () => {
  it('a configured default overrides the own version', async () => {
    const { web } = await mount({ channels: { default: { static_version: 'v16.4.2' } } });
    const a = await curl(`${web.url}${PREFIX}/default/version`);
    expect(a.status).toBe(200);
    expect(a.body).toBe('v16.4.2');
  });

  it('normalises versions to a leading v and refuses what is not semver', () => {
    const vs = new VersionServer({ ownVersion: '17.0.0-dev', dialer: new Dialer(), channels: { a: { static_version: '14.3.7' } } });
    return Promise.all([
      expect(vs.resolve('default', 'version')).resolves.toBe('v17.0.0-dev'),
      expect(vs.resolve('a', 'version')).resolves.toBe('v14.3.7'),
      expect(() => new VersionServer({ ownVersion: VERSION, dialer: new Dialer(), channels: { a: { static_version: 'latest' } } })).toThrow(
        expect.objectContaining({ code: 'GW_ERR_CONFIG_VALUE' }),
      ),
      expect(() => new VersionServer({ ownVersion: VERSION, dialer: new Dialer(), channels: { a: {} } })).toThrow(expect.objectContaining({ code: 'GW_ERR_CONFIG_CHANNEL' })),
      expect(() =>
        new VersionServer({ ownVersion: VERSION, dialer: new Dialer(), channels: { a: { static_version: 'v1.0.0', forward_url: 'https://x.example' } } }),
      ).toThrow(expect.objectContaining({ code: 'GW_ERR_CONFIG_CHANNEL' })),
    ]);
  });

  it('parsePath splits on the last segment', () => {
    expect(parsePath(`${PREFIX}/stable/v14/version`)).toEqual({ channel: 'stable/v14', what: 'version' });
    expect(parsePath(`${PREFIX}/a/b/c/critical`)).toEqual({ channel: 'a/b/c', what: 'critical' });
    expect(parsePath(`${PREFIX}/version/version`)).toEqual({ channel: 'version', what: 'version' });
  });
});

// --- forward_url channels through squid ----------------------------------------------------------------------------

describe('forward_url channels through squid', () => {
  it('forwards to an https upstream version server (test CA) through squid CONNECT', async () => {
    const cert = await pki.serverCert({ names: ['upstream.gw.test'], ips: [] });
    const upstreamVs = new VersionServer({ ownVersion: '15.9.9', dialer: new Dialer(), channels: { 'stable/cloud': { static_version: 'v15.2.0' } } });
    const upstream = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      if (!upstreamVs.handle(req, res)) res.writeHead(404).end();
    }, UPSTREAM_IP);
    cleanups.push(() => upstream.close());
    const forward = `https://upstream.gw.test:${upstream.port}${PREFIX}/stable/cloud`;
    const { web } = await mount({ channels: { cloud: { forward_url: forward }, 'cloud/slash': { forward_url: `${forward}/` } }, ca: pki.caPem });

    const a = await curl(`${web.url}${PREFIX}/cloud/version`);
    expect(a.status).toBe(200);
    expect(a.body).toBe('v15.2.0');
    expect(a.headers['content-type']).toBe('text/plain; charset=utf-8');
    expectNoStore(a);
    expect((await get(`${web.url}${PREFIX}/cloud/critical`)).body).toBe('no');
    expect((await get(`${web.url}${PREFIX}/cloud/slash/version`)).body).toBe('v15.2.0');
    const line = await squid.waitForAccessLog((l) => l.includes(`CONNECT upstream.gw.test:${upstream.port} 200`));
    expect(line).toContain('TCP_TUNNEL');
  });

  it('refuses an https upstream whose certificate is not trusted (no stale or default value instead)', async () => {
    const cert = await pki.serverCert({ names: ['upstream.gw.test'], ips: [] });
    const upstream = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => res.end('v15.2.0'), UPSTREAM_IP);
    cleanups.push(() => upstream.close());
    const { web } = await mount({ channels: { cloud: { forward_url: `https://upstream.gw.test:${upstream.port}/channel` } } }); // no ca
    const a = await curl(`${web.url}${PREFIX}/cloud/version`);
    expect(a.status).toBe(502);
    expect(errorCode(a)).toBe('GW_ERR_VERSION_UPSTREAM');
    expectNoStore(a);
  });

  it('accepts a plain http upstream answering "14.3.7\\n" (no v) and "yes\\n", and normalises them', async () => {
    const up = await flakyUpstream({ version: '14.3.7\n', critical: 'yes\n' });
    const { web } = await mount({ channels: { 'stable/v14': { forward_url: `http://plain.gw.test:${up.server.port}/v1/stable/v14` } } });
    const v = await curl(`${web.url}${PREFIX}/stable/v14/version`);
    expect(v.status).toBe(200);
    expect(v.body).toBe('v14.3.7');
    const c = await curl(`${web.url}${PREFIX}/stable/v14/critical`);
    expect(c.body).toBe('yes');
    expect([...up.state.hits.keys()].sort()).toEqual(['/v1/stable/v14/critical', '/v1/stable/v14/version']);
    await squid.waitForAccessLog((l) => l.includes(`CONNECT plain.gw.test:${up.server.port} 200`));
  });

  it('an upstream answering as upstream\'s version server does: "none" (no target) passed on, critical "true" / "false" read as yes / no', async () => {
    const up = await flakyUpstream({ version: 'none\n', critical: 'true\n' });
    const { web } = await mount({ channels: { up: { forward_url: `http://plain.gw.test:${up.server.port}/up` } }, cacheTtlMs: 0 });
    const v = await curl(`${web.url}${PREFIX}/up/version`);
    expect([v.status, v.body]).toEqual([200, 'none']);
    expect((await curl(`${web.url}${PREFIX}/up/critical`)).body).toBe('yes');
    up.state.critical = 'False';
    expect((await curl(`${web.url}${PREFIX}/up/critical`)).body).toBe('no');
    // "none" is a version answer only: as a critical flag it is refused.
    up.state.critical = 'none';
    expect(errorCode(await curl(`${web.url}${PREFIX}/up/critical`))).toBe('GW_ERR_VERSION_UPSTREAM');
  });

  it('NO_PROXY applies to forward_url fetches: a direct dial, and squid logs nothing for it', async () => {
    const up = await flakyUpstream({ version: 'v14.3.9', critical: 'no' });
    const lookup: net.LookupFunction = (_host, options, callback) => {
      if ((options as { all?: boolean }).all) (callback as never as (e: null, a: Array<{ address: string; family: number }>) => void)(null, [{ address: UPSTREAM_IP, family: 4 }]);
      else (callback as never as (e: null, a: string, f: number) => void)(null, UPSTREAM_IP, 4);
    };
    const { web } = await mount({
      channels: { direct: { forward_url: `http://plain.gw.test:${up.server.port}/direct` } },
      dialer: squidDialer({ NO_PROXY: '.gw.test' }, { lookup }),
    });
    expect((await curl(`${web.url}${PREFIX}/direct/version`)).body).toBe('v14.3.9');
    expect(up.hits('version')).toBe(1);
    expect((await squid.readAccessLog()).filter((l) => l.includes(`:${up.server.port} `))).toEqual([]);
  });

  it('caches each (channel, what) for the TTL, and asks upstream again once the clock passes it', async () => {
    const up = await flakyUpstream({ version: 'v14.3.7', critical: 'no' });
    let now = 1_000_000;
    const { web } = await mount({ channels: { c: { forward_url: `http://plain.gw.test:${up.server.port}/c` } }, clock: () => now, cacheTtlMs: 60_000 });
    const url = `${web.url}${PREFIX}/c/version`;
    expect((await get(url)).body).toBe('v14.3.7');
    expect(up.hits('version')).toBe(1);
    up.state.version = 'v14.3.8';
    now += 59_999;
    expect((await get(url)).body).toBe('v14.3.7'); // within the TTL: not upstream
    expect((await curl(url, '-I')).status).toBe(200);
    expect(up.hits('version')).toBe(1);
    expect(up.hits('critical')).toBe(0);
    expect((await get(`${web.url}${PREFIX}/c/critical`)).body).toBe('no'); // its own entry
    expect(up.hits('critical')).toBe(1);
    now += 1;
    expect((await get(url)).body).toBe('v14.3.8'); // the TTL has passed
    expect(up.hits('version')).toBe(2);
    expect((await get(url)).body).toBe('v14.3.8');
    expect(up.hits('version')).toBe(2);
  });

  it('concurrent requests for a missing or expired entry share one upstream fetch', async () => {
    const up = await flakyUpstream({ version: '14.3.7', critical: 'no' });
    up.state.delayMs = 300;
    let now = 0;
    const { web, vs } = await mount({ channels: { c: { forward_url: `http://plain.gw.test:${up.server.port}/c` } }, clock: () => now });
    const url = `${web.url}${PREFIX}/c/version`;
    const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => (i % 4 === 0 ? curl(url) : get(url))));
    for (const a of answers) {
      expect(a.status).toBe(200);
      expect(a.body).toBe('v14.3.7');
    }
    expect(up.hits('version')).toBe(1);

    now += 120_000; // expired: again one fetch for many callers
    up.state.version = '14.3.8';
    const values = await Promise.all(Array.from({ length: 40 }, () => vs.resolve('c', 'version')));
    expect(new Set(values)).toEqual(new Set(['v14.3.8']));
    expect(up.hits('version')).toBe(2);
  });

  it('a failing upstream is answered 502 / 504 JSON, never with the stale value, and recovers with a fresh one', async () => {
    const up = await flakyUpstream({ version: 'v14.3.7', critical: 'no' });
    let now = 0;
    const { web } = await mount({
      channels: { c: { forward_url: `http://flaky.gw.test:${up.server.port}/c` } },
      clock: () => now,
      cacheTtlMs: 1_000,
      upstreamTimeoutMs: 700,
    });
    const url = (what = 'version') => `${web.url}${PREFIX}/c/${what}`;
    expect((await curl(url())).body).toBe('v14.3.7');
    expect((await curl(url('critical'))).body).toBe('no');

    const cases: Array<[Mode, number, string]> = [
      ['500', 502, 'GW_ERR_VERSION_UPSTREAM'],
      ['garbage', 502, 'GW_ERR_VERSION_UPSTREAM'],
      ['html', 502, 'GW_ERR_VERSION_UPSTREAM'],
      ['slow', 504, 'GW_ERR_VERSION_UPSTREAM_TIMEOUT'],
    ];
    for (const [mode, status, code] of cases) {
      up.state.mode = mode;
      now += 5_000; // the cached answers are stale now
      for (const what of ['version', 'critical']) {
        const started = Date.now();
        const a = await curl(url(what));
        expect(a.status, `${mode} ${what}`).toBe(status);
        expect(errorCode(a), `${mode} ${what}`).toBe(code);
        expect(a.body).not.toContain('v14.3.7');
        expectNoStore(a);
        expect(Date.now() - started, `${mode} ${what} answered promptly`).toBeLessThan(5_000);
        const h = await curl(url(what), '-I'); // HEAD too, without a body
        expect(h.status).toBe(status);
        expect(h.body).toBe('');
      }
    }

    up.state.mode = 'ok';
    up.state.version = 'v14.3.8';
    expect((await curl(url())).body).toBe('v14.3.8');
    expect((await curl(url('critical'))).body).toBe('no');
  });

  it('an upstream that is down gives 502 (squid refuses the CONNECT), and the slow one 504 from resolve() too', async () => {
    const spare = await startHttpServer(() => undefined, UPSTREAM_IP);
    const port = spare.port;
    await spare.close(); // nothing listens there any more
    const { web, vs } = await mount({ channels: { gone: { forward_url: `http://down.gw.test:${port}/x` } } });
    const a = await curl(`${web.url}${PREFIX}/gone/version`);
    expect(a.status).toBe(502);
    expect(errorCode(a)).toBe('GW_ERR_VERSION_UPSTREAM');
    const e = await rejectsWith(vs.resolve('gone', 'critical'), 'GW_ERR_VERSION_UPSTREAM');
    expect(e.details.cause).toBe('GW_ERR_DIAL_PROXY_TARGET_UNREACHABLE');

    const up = await flakyUpstream({ version: 'v1.0.0', critical: 'no' });
    up.state.mode = 'slow';
    const slow = new VersionServer({ ownVersion: VERSION, dialer: squidDialer(), channels: { s: { forward_url: `http://flaky.gw.test:${up.server.port}/s` } }, upstreamTimeoutMs: 300 });
    const started = Date.now();
    await rejectsWith(slow.resolve('s', 'version'), 'GW_ERR_VERSION_UPSTREAM_TIMEOUT');
    expect(Date.now() - started).toBeLessThan(3_000);
  });
});
