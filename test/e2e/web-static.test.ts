/**
 * The Web UI's files on the web port (src/proxy/static.ts behind src/proxy/frontdoor.ts): curl over HTTP/2 and
 * HTTP/1.1, Node's HTTP/2 client and raw TLS for the paths curl would clean up.
 *
 * Until the UI's build lands, the files are a directory this test writes: an index.html, hashed assets with
 * precompressed .br/.gz siblings written here with zlib, a dot-file, a symbolic link to a file outside the
 * directory, and a secret file next to the directory that no path may reach. The real daemon (dist/) is
 * checked too: its /web/ is the built UI, or the page that says to build it, with the same headers.
 */
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import http2 from 'node:http2';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { promisify } from 'node:util';
import { brotliCompressSync, gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { startFrontDoor } from '../../src/proxy/frontdoor.js';
import { PROTOCOLS } from '../../src/proxy/protocols.js';
import { acceptedEncodings, contentSecurityPolicy, staticPathOf } from '../../src/proxy/static.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { VERSION } from '../../src/version.js';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { makeTestPki, type ServerCert, type TestPki } from '../helpers/tls.js';
import { parseCurlHead } from '../helpers/curl.js';

setRootLogger(createLogger({ level: 'silent' }));
const run = promisify(execFile);

const HOST = 'proxy.gw.test';
const SECRET = `secret-${Date.now()}-never-served`;
const APP_JS = `export const hello = "gateway";\n${'console.log("padding so that compression pays");\n'.repeat(200)}`;
const INDEX = '<!doctype html><title>Gateway</title><script type="module" src="/web/assets/app-4f2a9c.js"></script><div id="app"></div>\n';
const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

let pki: TestPki;
let cert: ServerCert;
let dir: string;
let root: string;
let port: number;
let unbuiltPort: number;
const cleanups: Array<() => unknown> = [];

async function door(webRoot: string): Promise<number> {
  const config = parseConfig(`gateway:\n  nodename: ${HOST}\nauth_service:\n  cluster_name: gw.test\n  proxy_listener_mode: separate\nproxy_service:\n  web_listen_addr: 127.0.0.1:0\n  public_addr: ${HOST}:443\n`, 'web-static.test.yaml');
  const d = await startFrontDoor({
    config,
    clusterName: 'gw.test',
    tls: { key: cert.keyPem, cert: cert.certPem, ca: [pki.caPem] },
    // Stands for the API router: what no route matches is a 404 with a code, as there.
    api: (req, res) => {
      req.resume();
      const body = JSON.stringify({ error: { code: 'GW_ERR_API_NOT_FOUND', message: `no route for ${req.method} ${req.url}`, hint: 'x' } });
      res.writeHead(404, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    },
    versions: new VersionServer({ channels: {}, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    webRoot,
    protocols: PROTOCOLS.filter((row) => row.kind === 'web'),
  });
  cleanups.push(() => d.close());
  return Number(/:(\d+)$/.exec(d.addresses.web!)![1]);
}

beforeAll(async () => {
  pki = await makeTestPki();
  cert = await pki.serverCert({ names: [HOST], ips: ['127.0.0.1'] });
  dir = await mkdtemp(join(tmpdir(), 'gw-web-static-'));
  root = join(dir, 'web');
  await mkdir(join(root, 'assets'), { recursive: true });
  await mkdir(join(root, 'deep', 'er'), { recursive: true });
  await writeFile(join(dir, 'secret.txt'), SECRET);
  await writeFile(join(root, 'index.html'), INDEX);
  await writeFile(join(root, 'assets', 'app-4f2a9c.js'), APP_JS);
  await writeFile(join(root, 'assets', 'app-4f2a9c.js.br'), brotliCompressSync(APP_JS));
  await writeFile(join(root, 'assets', 'app-4f2a9c.js.gz'), gzipSync(APP_JS));
  await writeFile(join(root, 'assets', 'style-77aa01.css'), 'body { margin: 0 }\n');
  await writeFile(join(root, 'favicon.svg'), '<svg xmlns="http://www.w3.org/2000/svg"/>');
  await writeFile(join(root, 'deep', 'er', 'note.txt'), 'nested');
  await writeFile(join(root, '.secret'), SECRET);
  await writeFile(join(root, 'with space.txt'), SECRET);
  await symlink(join(dir, 'secret.txt'), join(root, 'link-out'));
  await symlink('/etc', join(root, 'etc'));
  port = await door(root);
  await mkdir(join(dir, 'empty'));
  unbuiltPort = await door(join(dir, 'empty'));
}, 60_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

interface Answer {
  status: number;
  version: string;
  headers: Record<string, string>;
  body: Buffer;
}

/** curl -i with the answer's bytes as they came (no decoding unless --compressed is given). */
async function curl(path: string, ...args: string[]): Promise<Answer> {
  const p = args.includes('--unbuilt') ? unbuiltPort : port;
  const rest = args.filter((a) => a !== '--unbuilt');
  const out = join(dir, `body-${Math.random().toString(36).slice(2)}`);
  const { stdout } = await run('curl', ['-sS', '-D', '-', '-o', out, '--max-time', '20', '--cacert', pki.caCertPath, '--resolve', `${HOST}:${p}:127.0.0.1`, '-w', '%{http_version}', ...rest, `https://${HOST}:${p}${path}`], { encoding: 'utf8' });
  const head = parseCurlHead(stdout);
  const body = await readFile(out).catch(() => Buffer.alloc(0));
  await rm(out, { force: true });
  return { status: head.status, version: head.rest, headers: head.headers, body };
}

const SECURITY = {
  'content-security-policy': CSP,
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'strict-transport-security': 'max-age=31536000',
  'x-frame-options': 'DENY',
  'cross-origin-opener-policy': 'same-origin',
};

const BOTH = [
  ['--http2', '2'],
  ['--http1.1', '1.1'],
] as const;

describe('pages and assets', () => {
  it.each(BOTH)('%s: / and /web redirect to /web/; /web/ is index.html, no-store, with every security header', async (flag, version) => {
    for (const path of ['/', '/web']) {
      const r = await curl(path, flag);
      expect(r.version).toBe(version);
      expect(r.status).toBe(302);
      expect(r.headers.location).toBe('/web/');
      expect(r.headers).toMatchObject(SECURITY);
    }
    expect((await curl('/?next=/web/agents', flag)).headers.location).toBe('/web/?next=/web/agents');
    const page = await curl('/web/', flag);
    expect(page.status).toBe(200);
    expect(page.body.toString()).toBe(INDEX);
    expect(page.headers).toMatchObject({ ...SECURITY, 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
    expect((await curl('/web/index.html', flag)).body.toString()).toBe(INDEX);
  });

  it.each(BOTH)('%s: hashed assets are immutable for a year, other files revalidated; ETag gives 304', async (flag) => {
    const js = await curl('/web/assets/app-4f2a9c.js', flag);
    expect(js.status).toBe(200);
    expect(js.body.toString()).toBe(APP_JS);
    expect(js.headers).toMatchObject({ ...SECURITY, 'content-type': 'text/javascript; charset=utf-8', 'cache-control': 'public, max-age=31536000, immutable', vary: 'accept-encoding' });
    expect(js.headers['content-length']).toBe(String(Buffer.byteLength(APP_JS)));
    const again = await curl('/web/assets/app-4f2a9c.js', flag, '-H', `if-none-match: ${js.headers.etag}`);
    expect(again.status).toBe(304);
    expect(again.body.length).toBe(0);
    expect((await curl('/web/assets/style-77aa01.css', flag)).headers['content-type']).toBe('text/css; charset=utf-8');
    const icon = await curl('/web/favicon.svg', flag);
    expect(icon.headers).toMatchObject({ 'content-type': 'image/svg+xml', 'cache-control': 'no-cache' });
    expect((await curl('/web/deep/er/note.txt', flag)).body.toString()).toBe('nested');
  });

  it.each(BOTH)('%s: the precompressed file for what the client accepts (br first), the plain one otherwise', async (flag) => {
    const br = await curl('/web/assets/app-4f2a9c.js', flag, '-H', 'accept-encoding: gzip, deflate, br');
    expect(br.headers['content-encoding']).toBe('br');
    expect(br.body.equals(await readFile(join(root, 'assets', 'app-4f2a9c.js.br')))).toBe(true);
    const gz = await curl('/web/assets/app-4f2a9c.js', flag, '-H', 'accept-encoding: gzip');
    expect(gz.headers['content-encoding']).toBe('gzip');
    expect(gz.body.equals(await readFile(join(root, 'assets', 'app-4f2a9c.js.gz')))).toBe(true);
    const refused = await curl('/web/assets/app-4f2a9c.js', flag, '-H', 'accept-encoding: br;q=0, gzip;q=0');
    expect(refused.headers['content-encoding']).toBeUndefined();
    expect(br.headers.etag).not.toBe(gz.headers.etag);
    // curl --compressed decodes what it was sent: the same script.
    expect((await curl('/web/assets/app-4f2a9c.js', flag, '--compressed')).body.toString()).toBe(APP_JS);
    // A file with no precompressed sibling is sent as it is.
    expect((await curl('/web/assets/style-77aa01.css', flag, '-H', 'accept-encoding: br')).headers['content-encoding']).toBeUndefined();
  });

  it.each(BOTH)('%s: the page routes on the client: any other /web/ path is index.html, but a missing asset is a 404', async (flag) => {
    const route = await curl('/web/terminal/node-1?login=root', flag);
    expect(route.status).toBe(200);
    expect(route.body.toString()).toBe(INDEX);
    expect(route.headers['cache-control']).toBe('no-store');
    const missing = await curl('/web/assets/app-000000.js', flag);
    expect(missing.status).toBe(404);
    expect(JSON.parse(missing.body.toString())).toMatchObject({ error: { code: 'GW_ERR_API_NOT_FOUND' } });
    expect(missing.headers).toMatchObject(SECURITY);
  });

  it.each(BOTH)('%s: GET and HEAD only; HEAD has the headers and no body', async (flag) => {
    const head = await curl('/web/assets/app-4f2a9c.js', flag, '-I');
    expect(head.status).toBe(200);
    expect(head.headers['content-length']).toBe(String(Buffer.byteLength(APP_JS)));
    // curl -I writes the head to the output file too: no byte of the script after it.
    expect(head.body.toString()).not.toContain('export const hello');
    for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS']) {
      const r = await curl('/web/', flag, '-X', method);
      expect(r.status).toBe(405);
      expect(r.headers.allow).toBe('GET, HEAD');
      expect(JSON.parse(r.body.toString())).toMatchObject({ error: { code: 'GW_ERR_API_METHOD_NOT_ALLOWED' } });
    }
  });

  it('/webapi/ and /v1/ paths that match nothing are the API router\'s 404 with a code, not the page', async () => {
    for (const path of ['/webapi/nothing', '/v1/nothing', '/favicon.ico']) {
      const r = await curl(path, '--http2');
      expect(r.status).toBe(404);
      expect(JSON.parse(r.body.toString())).toMatchObject({ error: { code: 'GW_ERR_API_NOT_FOUND' } });
    }
  });
});

describe('no path reaches a file outside the index', () => {
  const NEVER = (body: Buffer) => {
    const text = body.toString('latin1');
    expect(text).not.toContain(SECRET);
    expect(text).not.toContain('root:x:0:0');
  };

  it.each([
    '/web/../secret.txt',
    '/web/assets/../../secret.txt',
    '/web/%2e%2e/secret.txt',
    '/web/%2E%2E/%2E%2E/etc/passwd',
    '/web/..%2fsecret.txt',
    '/web/assets%2f..%2f..%2fsecret.txt',
    '/web/%5c..%5csecret.txt',
    '/web/..\\secret.txt',
    '/web/%00',
    '/web/index.html%00.js',
    '/web//etc/passwd',
    '/web/./index.html',
    '/web/%',
    '/web/%c0%ae%c0%ae/secret.txt',
  ])('%s: refused with 400 before any lookup', async (path) => {
    for (const [flag] of BOTH) {
      const r = await curl(path, flag, '--path-as-is');
      NEVER(r.body);
      expect(r.status).toBe(400);
      expect(JSON.parse(r.body.toString())).toMatchObject({ error: { code: 'GW_ERR_API_BAD_REQUEST' } });
      expect(r.headers).toMatchObject(SECURITY);
    }
  });

  it.each(['/web/.secret', '/web/link-out', '/web/etc/passwd', '/web/with%20space.txt', '/web/%252e%252e/secret.txt', '/web/secret.txt'])(
    '%s: not in the index (dot-file, symbolic link, odd name, double encoding): the page, never the file',
    async (path) => {
      for (const [flag] of BOTH) {
        const r = await curl(path, flag, '--path-as-is');
        NEVER(r.body);
        expect(r.status).toBe(200);
        expect(r.body.toString()).toBe(INDEX);
      }
    },
  );

  it('Node\'s HTTP/2 client sends paths as given: dot segments are refused; a raw NUL is a protocol error', async () => {
    const socket = tls.connect({ host: '127.0.0.1', port, servername: HOST, ca: pki.caPem, ALPNProtocols: ['h2'] });
    await once(socket, 'secureConnect');
    const session = http2.connect(`https://${HOST}:${port}`, { createConnection: () => socket });
    session.on('error', () => undefined);
    cleanups.push(() => session.destroy());
    const get = async (path: string): Promise<number | string> => {
      const stream = session.request({ ':path': path });
      stream.end();
      try {
        const [head] = (await once(stream, 'response')) as [http2.IncomingHttpHeaders];
        const chunks: Buffer[] = [];
        for await (const c of stream) chunks.push(c as Buffer);
        NEVER(Buffer.concat(chunks));
        return Number(head[':status']);
      } catch (err) {
        return (err as NodeJS.ErrnoException).code ?? String(err);
      }
    };
    for (const path of ['/web/../secret.txt', '/web/assets/../../../etc/passwd', '/web/..']) expect(await get(path)).toBe(400);
    // nghttp2 refuses a header value with a NUL byte (RFC 9113 section 8.2.1): the stream is reset, the session goes on.
    expect(await get('/web/a\u0000b')).toBe('ERR_HTTP2_STREAM_ERROR');
    expect(await get('/web/')).toBe(200);
    session.close();
  });

  it('raw HTTP/1.1 request lines: a NUL byte, a backslash, an absolute URI', async () => {
    for (const target of ['/web/\u0000', '/web/..\\..\\secret.txt', `https://${HOST}/web/../secret.txt`]) {
      const s = tls.connect({ host: '127.0.0.1', port, servername: HOST, ca: pki.caPem, ALPNProtocols: ['http/1.1'] });
      await once(s, 'secureConnect');
      let text = '';
      s.setEncoding('latin1');
      s.on('data', (c: string) => (text += c));
      s.on('error', () => undefined);
      s.write(`GET ${target} HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n\r\n`);
      await once(s, 'close');
      expect(text).not.toContain(SECRET);
      expect(text).toMatch(/^HTTP\/1\.1 (400|404) /);
    }
  });
});

describe('the pieces', () => {
  it('staticPathOf decodes once and refuses what could name another file', () => {
    expect(staticPathOf('/web/assets/a.js')).toEqual({ path: '/web/assets/a.js' });
    expect(staticPathOf('/web/nodes/a%20b')).toEqual({ path: '/web/nodes/a b' });
    expect(staticPathOf('/web/%252e%252e')).toEqual({ path: '/web/%2e%2e' });
    for (const bad of ['/web/..', '/web/a/../b', '/web/%2e%2e', '/web/a%2fb', '/web/a%5Cb', '/web/a\\b', '/web/%00', '/web/a//b', '/web/%e0%a4%a', `/web/${'a'.repeat(3000)}`]) {
      expect(staticPathOf(bad)).toHaveProperty('refused');
    }
  });

  it('acceptedEncodings reads q-values and *', () => {
    expect(acceptedEncodings('gzip, deflate, br')).toEqual(['br', 'gzip']);
    expect(acceptedEncodings('gzip;q=0.5, br;q=0')).toEqual(['gzip']);
    expect(acceptedEncodings('*')).toEqual(['br', 'gzip']);
    expect(acceptedEncodings('identity')).toEqual([]);
    expect(acceptedEncodings(undefined)).toEqual([]);
    expect(acceptedEncodings(`${'x,'.repeat(5000)}br`)).toEqual([]);
  });

  it('the CSP names the page origin only; form-action may list an IdP', () => {
    expect(contentSecurityPolicy()).toBe(CSP);
    expect(contentSecurityPolicy(['https://idp.example.com'])).toContain("form-action 'self' https://idp.example.com;");
  });
});

describe('not built', () => {
  it('/web/ says to run npm run build (503, the same headers); / still redirects', async () => {
    const page = await curl('/web/', '--unbuilt', '--http2');
    expect(page.status).toBe(503);
    expect(page.body.toString()).toContain('npm run build');
    expect(page.headers).toMatchObject({ ...SECURITY, 'cache-control': 'no-store' });
    expect((await curl('/', '--unbuilt')).status).toBe(302);
    expect((await curl('/web/assets/app.js', '--unbuilt')).status).toBe(503);
  });
});

describe('the daemon (dist/)', () => {
  let gw: RunningGateway;
  beforeAll(async () => {
    gw = await startGateway(
      ['gateway:', '  nodename: web-static', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: web.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', '  public_addr: localhost:443', ''].join('\n'),
    );
  }, 60_000);
  afterAll(async () => {
    await gw?.stop();
  });

  it('serves /web/ (the built UI, or the page saying to build it) over h2 and http/1.1 with the headers; API 404s keep their code', async () => {
    const webPort = gw.addresses.web!.split(':').pop()!;
    const base = ['-sS', '--cacert', join(gw.dataDir, 'admin', 'host-ca.pem'), '--resolve', `localhost:${webPort}:127.0.0.1`];
    for (const [flag, version] of BOTH) {
      const { stdout } = await run('curl', [...base, '-D', '-', '-o', '/dev/null', '-w', '%{http_version}', flag, `https://localhost:${webPort}/web/`], { encoding: 'utf8' });
      expect(stdout.endsWith(version)).toBe(true);
      expect(stdout).toMatch(/^HTTP\/[12.]+ (200|503)/);
      expect(stdout.toLowerCase()).toContain(`content-security-policy: ${CSP.toLowerCase()}`);
      const api = await run('curl', [...base, flag, `https://localhost:${webPort}/webapi/nothing-here`], { encoding: 'utf8' });
      expect(JSON.parse(api.stdout)).toMatchObject({ error: { code: 'GW_ERR_API_NOT_FOUND' } });
    }
  }, 60_000);

  it('over HTTP/2 the API router reads the client certificate (src/auth/peeridentity.ts peerIdentity); the version server answers', async () => {
    const webPort = gw.addresses.web!.split(':').pop()!;
    const admin = join(gw.dataDir, 'admin');
    const base = ['-sS', '--http2', '-w', '\n%{http_version}', '--cacert', join(admin, 'host-ca.pem'), '--resolve', `localhost:${webPort}:127.0.0.1`];
    const status = await run('curl', [...base, '--cert', join(admin, 'cert.pem'), '--key', join(admin, 'key.pem'), `https://localhost:${webPort}/v1/status`], { encoding: 'utf8' });
    const [body, version] = status.stdout.split('\n');
    expect(version).toBe('2');
    expect(JSON.parse(body!)).toMatchObject({ ca_pin: expect.any(String), identity: { kind: 'admin' } });
    const anonymous = await run('curl', [...base, `https://localhost:${webPort}/v1/status`], { encoding: 'utf8' });
    expect(JSON.parse(anonymous.stdout.split('\n')[0]!)).toMatchObject({ error: { code: 'GW_ERR_AUTH_UNAUTHENTICATED' } });
    const v = await run('curl', [...base, `https://localhost:${webPort}/v1/webapi/automaticupgrades/channel/default/version`], { encoding: 'utf8' });
    expect(v.stdout).toMatch(/^v\d+\.\d+\.\d+\S*\n2$/);
  }, 60_000);
});
