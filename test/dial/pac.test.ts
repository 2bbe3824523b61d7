/**
 * PAC files for the Dialer (src/dial/pac.ts) against real servers: the PAC served over HTTP by a Node server in
 * the test (a static file), the proxy it names a real squid, and a second proxy that is down (a port nothing
 * listens on) to prove fail-over. Hostile servers: slow to serve, too large, not 200. The cache's clock is
 * injected, so the schedule and the back-off are walked without waiting.
 */
import dns from 'node:dns';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import type http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { fetchPacFile, PAC_BAD_ENTRY_MS, PAC_REFRESH_MS, PacCache } from '../../src/dial/pac.js';
import { GatewayError } from '../../src/errors.js';
import { codeOf } from '../helpers/errors.js';
import { rootTest } from '../helpers/root.js';
import { startEchoServer, startHttpServer, startSilentServer, type HttpTestServer, type TestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { eventually } from '../helpers/wait.js';
import { dialError } from '../helpers/dial.js';

const TARGET_IP = '127.0.0.3';
const PAC_IP = '127.0.0.4';

let dir: string;
let squid: Squid;
let echo: TestServer;
let deadPort: number;
const servers: HttpTestServer[] = [];

/** The PAC server: serves `files[path]` (a function of the request count, so a test can change it). */
const files = new Map<string, string | ((n: number) => string | { status: number })>();
const hits = new Map<string, number>();
const handler: http.RequestListener = (req, res) => {
  const path = req.url ?? '/';
  const n = (hits.get(path) ?? 0) + 1;
  hits.set(path, n);
  const f = files.get(path);
  const body = typeof f === 'function' ? f(n) : f;
  if (body === undefined || typeof body === 'object') {
    res.writeHead(typeof body === 'object' ? body.status : 404).end();
    return;
  }
  res.writeHead(200, { 'content-type': 'application/x-ns-proxy-autoconfig' }).end(body);
};
let pacServer: HttpTestServer;

/** The names the tests dial are known only to squid (its hosts file): a direct dial cannot reach them by accident. */
const lookup: net.LookupFunction = (hostname, options, callback) => dns.lookup(hostname, options, callback as never);

function pacFile(answer: string): string {
  return `function FindProxyForURL(url, host) {\n  if (shExpMatch(host, "*.gw.test")) return "${answer}";\n  return "DIRECT";\n}\n`;
}

function serve(path: string, answer: string): string {
  files.set(path, pacFile(answer));
  return `${pacServer.url}${path}`;
}

function dialer(pacUrl: string, cache = new PacCache()): Dialer {
  return new Dialer({ env: { HTTPS_PROXY: `pac+${pacUrl}` }, lookup, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000, pacCache: cache });
}

async function roundTrip(socket: net.Socket, msg: string): Promise<string> {
  let got = '';
  await new Promise<void>((resolve, reject) => {
    socket.on('data', (c: Buffer) => {
      got += c.toString();
      if (got.length >= msg.length) resolve();
    });
    socket.once('error', reject);
    socket.write(msg);
  });
  socket.destroy();
  return got;
}


beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-pac-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${TARGET_IP} echo.gw.test web.gw.test\n`, { mode: 0o644 });
  echo = await startEchoServer(TARGET_IP);
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  pacServer = await startHttpServer(handler, PAC_IP);
  // A port nothing listens on, on squid's address: the proxy that is down.
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, squid.host, r));
  deadPort = (probe.address() as net.AddressInfo).port;
  await new Promise((r) => probe.close(r));
}, 60_000);

afterAll(async () => {
  await Promise.allSettled([squid?.stop(), echo?.close(), pacServer?.close(), ...servers.map((s) => s.close())]);
  await rm(dir, { recursive: true, force: true });
});

describe('dialing through the PAC', () => {
  it('the entry the PAC chose carries the dial, and squid logs it', async () => {
    const url = serve('/chosen.pac', `PROXY ${squid.host}:${squid.port}; DIRECT`);
    const socket = await dialer(url).dial(`echo.gw.test:${echo.port}`);
    expect(await roundTrip(socket, 'through the PAC')).toBe('through the PAC');
    await squid.waitForAccessLog((l) => l.includes(`CONNECT echo.gw.test:${echo.port} 200`));
  });

  it('fail-over: a proxy that is down is passed over for the next entry', async () => {
    const url = serve('/failover.pac', `PROXY ${squid.host}:${deadPort}; PROXY ${squid.host}:${squid.port}`);
    const socket = await dialer(url).dial(`web.gw.test:${echo.port}`);
    expect(await roundTrip(socket, 'after fail-over')).toBe('after fail-over');
    await squid.waitForAccessLog((l) => l.includes(`CONNECT web.gw.test:${echo.port} 200`));
  });

  it('an entry that could not be reached is tried last for 5 minutes, then first again', async () => {
    let now = 20_000_000;
    const cache = new PacCache({ now: () => now });
    const silent = await startSilentServer(squid.host); // accepts, never answers CONNECT: PROXY_NO_ANSWER
    try {
      const url = serve('/bad-first.pac', `PROXY ${squid.host}:${silent.port}; PROXY ${squid.host}:${squid.port}`);
      const d = new Dialer({ env: { HTTPS_PROXY: `pac+${url}` }, lookup, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 300, pacCache: cache });
      const dialEcho = async (msg: string) => expect(await roundTrip(await d.dial(`echo.gw.test:${echo.port}`), msg)).toBe(msg);
      await dialEcho('first');
      expect(silent.connections).toBe(1);
      await dialEcho('second'); // squid first now: the silent proxy is not asked
      expect(silent.connections).toBe(1);
      now += PAC_BAD_ENTRY_MS;
      await dialEcho('third'); // the 5 minutes are over: the PAC's order again, and it fails over again
      expect(silent.connections).toBe(2);
    } finally {
      await silent.close();
    }
  });

  it('a PAC that names only dead proxies: GW_ERR_DIAL_PAC_EXHAUSTED with each entry and why', async () => {
    const url = serve('/dead.pac', `PROXY ${squid.host}:${deadPort}; HTTPS ${squid.host}:${deadPort}; SOCKS5 ${squid.host}:1080`);
    const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_EXHAUSTED');
    expect(err.message).toContain(url);
    expect(err.message).toContain(`PROXY ${squid.host}:${deadPort}: GW_ERR_DIAL_PROXY_UNREACHABLE`);
    expect(err.message).toContain(`HTTPS ${squid.host}:${deadPort}: GW_ERR_DIAL_PROXY_UNREACHABLE`);
    expect(err.message).toContain(`SOCKS5 ${squid.host}:1080`);
  });

  it('a proxy that answers decides: its refusal is the error, and DIRECT behind it is not tried', async () => {
    const strict = await startSquid({ connectPorts: [443], extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
    try {
      const url = serve('/refusing.pac', `PROXY ${strict.host}:${strict.port}; DIRECT`);
      // Had DIRECT been tried after the 403, the name (known only to squid) would fail to resolve: PAC_EXHAUSTED.
      const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
      expect(err.code).toBe('GW_ERR_DIAL_PROXY_REFUSED');
      expect(err.message).toContain(`from PAC ${url}`);
    } finally {
      await strict.stop();
    }
  });

  it('dial-plan (Dialer.askPac) shows the PAC URL, its answer and what each entry becomes, without dialing', async () => {
    const url = serve('/plan.pac', `SOCKS4 ${squid.host}:1080; SOCKS5 ${squid.host}:1080; PROXY ${squid.host}:${squid.port}; DIRECT`);
    const d = dialer(url);
    const decision = d.plan(`echo.gw.test:${echo.port}`);
    const res = await d.askPac(decision.pac!, decision.target);
    expect(res.url).toBe(url);
    expect(res.answer).toBe(`SOCKS4 ${squid.host}:1080; SOCKS5 ${squid.host}:1080; PROXY ${squid.host}:${squid.port}; DIRECT`);
    expect(res.steps.map((s) => [s.entry.text, s.proxy?.display ?? null, s.skipped ?? null])).toEqual([
      [`SOCKS4 ${squid.host}:1080`, null, 'this Dialer does not dial socks4:// proxies'],
      // A PAC's SOCKS5 has the proxy resolve names, as browsers do (socks5h://).
      [`SOCKS5 ${squid.host}:1080`, `socks5h://${squid.host}:1080`, null],
      [`PROXY ${squid.host}:${squid.port}`, `http://${squid.host}:${squid.port}`, null],
      ['DIRECT', null, null],
    ]);
  });
});

describe('hostile PAC files, through the Dialer', () => {
  it('a PAC that loops: the dial fails with GW_ERR_DIAL_PAC_TIMEOUT naming the URL, and no proxy is dialled', async () => {
    files.set('/loop.pac', 'function FindProxyForURL(url, host) {\n  for (;;) {}\n}\n');
    const url = `${pacServer.url}/loop.pac`;
    const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_TIMEOUT');
    expect(err.message).toContain(url);
  });

  it('a PAC that throws: GW_ERR_DIAL_PAC_SCRIPT with the URL, and the line for an error (a string thrown has no line)', async () => {
    files.set('/throws.pac', 'function FindProxyForURL(url, host) {\n  if (host) {\n    return proxyFor(host);\n  }\n}\n');
    const url = `${pacServer.url}/throws.pac`;
    const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toBe(`the PAC file ${url} (line 3): FindProxyForURL threw: proxyFor is not defined`);
    files.set('/throws-string.pac', 'function FindProxyForURL(url, host) {\n  throw "no proxy for " + host;\n}\n');
    const bare = await dialError(dialer(`${pacServer.url}/throws-string.pac`), `echo.gw.test:${echo.port}`);
    expect(bare.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(bare.message).toBe(`the PAC file ${pacServer.url}/throws-string.pac: FindProxyForURL threw: no proxy for echo.gw.test`);
  });

  it("a PAC that is not JavaScript (a captive portal's page): GW_ERR_DIAL_PAC_SCRIPT at line 1", async () => {
    files.set('/portal.pac', '<!DOCTYPE html><html><body>Sign in to the guest network</body></html>');
    const err = await dialError(dialer(`${pacServer.url}/portal.pac`), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(err.message).toContain('(line 1): not valid JavaScript');
  });

  it('a PAC that answers nonsense: GW_ERR_DIAL_PAC_ANSWER naming the URL and the target', async () => {
    files.set('/nonsense.pac', 'function FindProxyForURL(url, host) { return "PROXY squid.corp"; }');
    const url = `${pacServer.url}/nonsense.pac`;
    const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_ANSWER');
    expect(err.message).toContain(`the PAC file ${url} answered for echo.gw.test:${echo.port}`);
    expect(err.message).toContain('the port is missing');
  });
});

describe('fetching the PAC', () => {
  it('a PAC that cannot be fetched is GW_ERR_DIAL_PAC_FETCH naming the URL (404, refused)', async () => {
    const missing = `${pacServer.url}/missing.pac`;
    const err = await dialError(dialer(missing), `echo.gw.test:${echo.port}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect(err.message).toBe(`cannot fetch the PAC file ${missing}: the server answered 404 Not Found, not 200`);
    expect(await codeOf(fetchPacFile(`http://${PAC_IP}:${deadPort}/p.pac`))).toBe('GW_ERR_DIAL_PAC_FETCH');
  });

  it('a password in the PAC URL is sent to the PAC server but never shown in an error or the log', async () => {
    let authorization: string | undefined;
    files.set('/private.pac', () => ({ status: 403 }));
    const seen = await startHttpServer((req, res) => {
      authorization = req.headers.authorization;
      handler(req, res);
    }, PAC_IP);
    servers.push(seen);
    const url = seen.url.replace('http://', 'http://pacuser:Pac-s3cret@') + '/private.pac';
    const err = await dialError(dialer(url), `echo.gw.test:${echo.port}`);
    expect(authorization).toBe(`Basic ${Buffer.from('pacuser:Pac-s3cret').toString('base64')}`);
    expect(err.code).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect(err.message).toContain(`http://pacuser:***@${PAC_IP}`);
    expect(JSON.stringify({ m: err.message, d: err.details })).not.toContain('Pac-s3cret');
    // A script that fails names the URL in its error, and a dial through the PAC logs it: neither has the password.
    files.set('/private2.pac', 'function FindProxyForURL(url, host) {\n  throw new Error("no");\n}\n');
    const lines: string[] = [];
    const { createLogger, setRootLogger } = await import('../../src/log.js');
    const { Writable } = await import('node:stream');
    setRootLogger(createLogger({ level: 'trace', format: 'json', destination: new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }) }));
    const scriptErr = await dialError(dialer(url.replace('/private.pac', '/private2.pac')), `echo.gw.test:${echo.port}`);
    expect(scriptErr.code).toBe('GW_ERR_DIAL_PAC_SCRIPT');
    expect(scriptErr.message).toContain(`http://pacuser:***@${PAC_IP}`);
    expect(scriptErr.message).not.toContain('Pac-s3cret');
    files.set('/private3.pac', pacFile(`PROXY ${squid.host}:${deadPort}; PROXY ${squid.host}:${squid.port}`));
    (await dialer(url.replace('/private.pac', '/private3.pac')).dial(`echo.gw.test:${echo.port}`)).destroy();
    expect(lines.join('')).toContain('pacuser:***@');
    expect(lines.join('')).not.toContain('Pac-s3cret');
  });

  it('a dial cancelled while the PAC server is silent ends as cancelled, not after the fetch deadline', async () => {
    const silent = await startSilentServer(PAC_IP);
    try {
      const controller = new AbortController();
      const dialing = dialer(`http://${PAC_IP}:${silent.port}/proxy.pac`).dial(`echo.gw.test:${echo.port}`, { signal: controller.signal });
      await eventually('the PAC fetch reached the server', async () => {
        if (silent.connections === 0) throw new Error('no connection yet');
      });
      controller.abort();
      expect(await codeOf(dialing)).toBe('GW_ERR_DIAL_ABORTED');
    } finally {
      await silent.close();
    }
  });

  it('a PAC that is too large is refused at the cap', async () => {
    files.set('/large.pac', `// ${'x'.repeat(200_000)}\n${pacFile('DIRECT')}`);
    const err = await fetchPacFile(`${pacServer.url}/large.pac`, { maxBytes: 64 * 1024 }).catch((e: GatewayError) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect((err as GatewayError).message).toContain('larger than 65536 bytes');
  });

  it('a server that is slow to serve (a byte at a time, never done) is cut at the deadline', async () => {
    const slow = await startHttpServer((_req, res) => {
      res.writeHead(200);
      const t = setInterval(() => res.write('/'), 50);
      res.on('close', () => clearInterval(t));
    }, PAC_IP);
    servers.push(slow);
    const err = await fetchPacFile(`${slow.url}/slow.pac`, { timeoutMs: 500 }).catch((e: GatewayError) => e);
    expect((err as GatewayError).code).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect((err as GatewayError).message).toContain('no complete answer within 500 ms');
  });

  it('pac+file: read from disk, with the same cap', async () => {
    const path = join(dir, 'local.pac');
    await writeFile(path, pacFile('DIRECT'));
    expect(await fetchPacFile(`file://${path}`)).toContain('FindProxyForURL');
    expect(await codeOf(fetchPacFile(`file://${path}`, { maxBytes: 10 }))).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect(await codeOf(fetchPacFile(`file://${join(dir, 'none.pac')}`))).toBe('GW_ERR_DIAL_PAC_FETCH');
  });

  it('cached; fetched again on the schedule; a failed fetch keeps the last good copy and backs off', async () => {
    let now = 1_000_000;
    const cache = new PacCache({ now: () => now });
    let version = 'one';
    files.set('/cached.pac', () => (version === 'down' ? { status: 503 } : `// ${version}\n${pacFile('DIRECT')}`));
    const spec = { kind: 'url' as const, url: `${pacServer.url}/cached.pac`, display: 'x', source: 'HTTPS_PROXY' };
    expect((await cache.get(spec)).text).toContain('// one');
    version = 'two';
    expect((await cache.get(spec)).text).toContain('// one');
    expect(hits.get('/cached.pac')).toBe(1);
    now += PAC_REFRESH_MS;
    expect((await cache.get(spec)).text).toContain('// two');
    expect(hits.get('/cached.pac')).toBe(2);
    // The server fails: the last good copy is still used, and the next fetch waits for the back-off.
    version = 'down';
    now += PAC_REFRESH_MS;
    expect((await cache.get(spec)).text).toContain('// two');
    expect(hits.get('/cached.pac')).toBe(3);
    expect((await cache.get(spec)).text).toContain('// two');
    expect(hits.get('/cached.pac')).toBe(3);
    version = 'three';
    now += 1_000; // the first back-off delay is at most 1 s (PAC_RETRY)
    expect((await cache.get(spec)).text).toContain('// three');
    expect(hits.get('/cached.pac')).toBe(4);
  });

  it('with no good copy, dials fail at once with the fetch error until the back-off has passed', async () => {
    let now = 5_000_000;
    const cache = new PacCache({ now: () => now });
    files.set('/flaky.pac', (n) => (n === 1 ? { status: 500 } : pacFile('DIRECT')));
    const spec = { kind: 'url' as const, url: `${pacServer.url}/flaky.pac`, display: 'x', source: 'HTTPS_PROXY' };
    expect(await codeOf(cache.get(spec))).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect(await codeOf(cache.get(spec))).toBe('GW_ERR_DIAL_PAC_FETCH');
    expect(hits.get('/flaky.pac')).toBe(1);
    now += 1_000;
    expect((await cache.get(spec)).text).toContain('FindProxyForURL');
  });

  it('an answer that all fails sends the PAC to be fetched again (after the back-off)', async () => {
    let now = 9_000_000;
    const cache = new PacCache({ now: () => now });
    files.set('/moved.pac', (n) => pacFile(n === 1 ? `PROXY ${squid.host}:${deadPort}` : `PROXY ${squid.host}:${squid.port}`));
    const d = dialer(`${pacServer.url}/moved.pac`, cache);
    expect(await codeOf(d.dial(`echo.gw.test:${echo.port}`))).toBe('GW_ERR_DIAL_PAC_EXHAUSTED');
    now += 1_000;
    const socket = await d.dial(`echo.gw.test:${echo.port}`);
    expect(await roundTrip(socket, 'after re-fetch')).toBe('after re-fetch');
    expect(hits.get('/moved.pac')).toBe(2);
  });

  rootTest(['port80'])('WPAD: the most specific search domain with a wpad.dat wins; the others are not fetched', async () => {
    const wpadHits: string[] = [];
    const { createServer } = await import('node:http');
    const server = createServer((req, res) => {
      wpadHits.push(`${req.headers.host}${req.url}`);
      if (req.headers.host === 'wpad.corp.test') res.writeHead(200).end(pacFile(`PROXY ${squid.host}:${squid.port}`));
      else res.writeHead(404).end();
    });
    await new Promise<void>((r) => server.listen(80, '127.0.0.5', r));
    try {
      // wpad.eu.corp.test answers 404, wpad.corp.test has the file; wpad.test is never asked (two labels at least).
      const wpadLookup: net.LookupFunction = (hostname, options, callback) => {
        if (!hostname.startsWith('wpad.')) return dns.lookup(hostname, options, callback as never);
        if ((options as dns.LookupAllOptions).all) (callback as never as (e: null, a: dns.LookupAddress[]) => void)(null, [{ address: '127.0.0.5', family: 4 }]);
        else (callback as never as (e: null, a: string, f: number) => void)(null, '127.0.0.5', 4);
      };
      const cache = new PacCache({ lookup: wpadLookup, resolvConf: async () => 'search eu.corp.test\n' });
      const d = new Dialer({ env: { GATEWAY_WPAD: '1' }, lookup, pacCache: cache });
      const socket = await d.dial(`echo.gw.test:${echo.port}`);
      expect(await roundTrip(socket, 'via WPAD')).toBe('via WPAD');
      expect(wpadHits).toEqual(['wpad.eu.corp.test/wpad.dat', 'wpad.corp.test/wpad.dat']);
      const none = new PacCache({ lookup: wpadLookup, resolvConf: async () => 'nameserver 10.0.0.1\n' });
      expect(await codeOf(new Dialer({ env: { GATEWAY_WPAD: '1' }, pacCache: none }).dial(`echo.gw.test:${echo.port}`))).toBe('GW_ERR_DIAL_WPAD_NOT_FOUND');
    } finally {
      await new Promise((r) => server.close(r));
    }
  });
});
