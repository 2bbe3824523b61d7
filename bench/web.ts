/**
 * bench:web — the Web UI's first page, as a user's browser gets it, against nginx serving the very same files.
 *
 *   gateway   `gateway start` (auth + proxy, TLS routing) on 127.0.0.1, its web port with a certificate of the
 *             bench's test CA (proxy_service.https_keypairs), serving dist/web/ (built by `npm run build`)
 *   nginx     Debian's nginx-light, TLS + HTTP/2, the same certificate, root = the same dist/web/, index.html as the
 *             fallback of every /web/ path, gzip_static on (nginx-light has no brotli: the gateway serves .br to
 *             Chromium, nginx .gz; the transferred bytes are in the table)
 *
 * The browser is Debian's Chromium driven by playwright-core, headless, trusting the bench's test CA through an NSS
 * database of its own (as a user's browser trusts the cluster), one new browser context (empty cache, a new TLS
 * connection) per load; the two servers take turns, BENCH_RUNS loads each. Per load, from the page's own
 * Navigation Timing and Paint Timing entries:
 *   before connect    connectStart: the browser's own steps before it dials (no byte reaches the server yet)
 *   first byte        responseStart - connectStart (TCP, TLS handshake and the answer's first byte)
 *   DOM ready         domContentLoadedEventEnd
 *   load              loadEventEnd (every script and style fetched and run)
 *   sign-in form      until the login form's user field is in the DOM (the page's code has run and rendered)
 * Medians, and the ratio gateway / nginx. Also the bundle: the bytes of dist/web/ (raw, .gz, .br), and of what the
 * first page fetches.
 *
 * Settings: BENCH_RUNS (15). Writes bench/RESULTS.md section "web" (BENCH_RECORD=0: print only).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import { chromium, type Browser } from 'playwright-core';
import { startGateway, type RunningGateway } from '../test/helpers/gateway.js';
import { makeNssDb } from '../test/helpers/browser.js';
import { makeTestPki } from '../test/helpers/tls.js';
import { envNumber } from './common.js';
import { recordSection } from './record.js';

const RUNS = envNumber('BENCH_RUNS', 15);
const RECORD = process.env.BENCH_RECORD !== '0';
const WEB_DIR = fileURLToPath(new URL('../dist/web/', import.meta.url));
const NGINX = '/usr/sbin/nginx';
const CHROMIUM = '/usr/bin/chromium';
const FIRST_PAGE = '/web/login';
const FORM = '[data-testid="login-user"]';

interface Load {
  /** Navigation start to the connection's start: the browser's own steps (no byte has gone to the server yet). */
  beforeConnect: number;
  /** TCP + TLS + the answer's first byte: connectStart → responseStart. */
  firstByte: number;
  domReady: number;
  load: number;
  form: number;
  transferred: number;
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** nginx in the foreground with its own prefix, pid file and logs in dir. */
async function startNginx(dir: string, port: number, cert: { certPath: string; keyPath: string }): Promise<ChildProcess> {
  const conf = join(dir, 'nginx.conf');
  await writeFile(
    conf,
    [
      'worker_processes 1;',
      'daemon off;',
      `pid ${join(dir, 'nginx.pid')};`,
      `error_log ${join(dir, 'nginx-error.log')} warn;`,
      'events { worker_connections 1024; }',
      'http {',
      '  include /etc/nginx/mime.types;',
      '  access_log off;',
      `  client_body_temp_path ${dir}/body; proxy_temp_path ${dir}/proxy; fastcgi_temp_path ${dir}/fcgi; uwsgi_temp_path ${dir}/uwsgi; scgi_temp_path ${dir}/scgi;`,
      '  server {',
      `    listen 127.0.0.1:${port} ssl http2;`,
      `    ssl_certificate ${cert.certPath};`,
      `    ssl_certificate_key ${cert.keyPath};`,
      '    ssl_protocols TLSv1.3;',
      // dist/ holds web/: the same files at the same paths. (Workers run as nobody: dist/ must be world-readable.)
      `    root ${join(WEB_DIR, '..')};`,
      '    gzip_static on;',
      '    location /web/assets/ { add_header cache-control "public, max-age=31536000, immutable"; }',
      '    location /web/ { try_files $uri /web/index.html; add_header cache-control no-store; }',
      '  }',
      '}',
      '',
    ].join('\n'),
  );
  const child = spawn(NGINX, ['-c', conf, '-p', dir], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr!.on('data', (c: Buffer) => (log += c.toString()));
  const deadline = Date.now() + 10_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`nginx exited with ${child.exitCode}:\n${log}\n${readSafe(join(dir, 'nginx-error.log'))}`);
    if (existsSync(join(dir, 'nginx.pid'))) return child;
    if (Date.now() > deadline) throw new Error(`nginx did not start:\n${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function readSafe(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return '';
  }
}

/** One cold load of the first page in a new context: the page's own timings. */
async function loadOnce(browser: Browser, base: string): Promise<Load> {
  // The test CA is trusted through the browser's NSS database: with ignoreHTTPSErrors, Chromium first fails the
  // certificate, then dials again, and the page's timings included that second handshake.
  const context = await browser.newContext({ ignoreHTTPSErrors: false });
  try {
    const page = await context.newPage();
    let transferred = 0;
    page.on('requestfinished', (req) => {
      void req.sizes().then((s) => (transferred += s.responseBodySize + s.responseHeadersSize)).catch(() => undefined);
    });
    await page.goto(base + FIRST_PAGE, { waitUntil: 'load' });
    await page.waitForSelector(FORM);
    // A string: this file is type-checked without the DOM's types.
    const t = (await page.evaluate(
      `(() => { const nav = performance.getEntriesByType('navigation')[0];
        return { beforeConnect: nav.connectStart, firstByte: nav.responseStart - nav.connectStart, domReady: nav.domContentLoadedEventEnd, load: nav.loadEventEnd, form: performance.now() }; })()`,
    )) as Omit<Load, 'transferred'>;
    // requestfinished's sizes arrive asynchronously: give them a turn.
    await new Promise((r) => setTimeout(r, 50));
    return { ...t, transferred };
  } finally {
    await context.close();
  }
}

/** Bytes of every file under dir by variant: raw, .gz, .br. */
function bundleBytes(dir: string): { raw: number; gz: number; br: number; files: number } {
  const out = { raw: 0, gz: 0, br: 0, files: 0 };
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else if (name.endsWith('.gz')) out.gz += statSync(p).size;
      else if (name.endsWith('.br')) out.br += statSync(p).size;
      else {
        out.raw += statSync(p).size;
        out.files += 1;
      }
    }
  };
  walk(dir);
  return out;
}

/** The files the first page names (index.html's scripts and styles), with their raw and compressed sizes. */
function firstPageBytes(dir: string): { raw: number; gz: number; br: number } {
  const html = readFileSync(join(dir, 'index.html'), 'utf8');
  const refs = [...html.matchAll(/(?:src|href)="\/web\/([^"]+)"/g)].map((m) => m[1]!).filter((r) => existsSync(join(dir, r)));
  const size = (p: string) => (existsSync(p) ? statSync(p).size : 0);
  const files = ['index.html', ...refs];
  return {
    raw: files.reduce((a, f) => a + size(join(dir, f)), 0),
    gz: files.reduce((a, f) => a + size(join(dir, `${f}.gz`)), 0),
    br: files.reduce((a, f) => a + size(join(dir, `${f}.br`)), 0),
  };
}

async function main(): Promise<void> {
  if (!existsSync(join(WEB_DIR, 'index.html'))) throw new Error(`no ${relative(process.cwd(), WEB_DIR)}index.html: run 'npm run build' first (npm run bench:web does)`);
  const loadBefore = loadavg()[0]!;
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-web-'));
  const pki = await makeTestPki();
  const cert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
  const webPort = await getPort({ host: '127.0.0.1' });
  const nginxPort = await getPort({ host: '127.0.0.1' });
  let gateway: RunningGateway | undefined;
  let nginx: ChildProcess | undefined;
  let browser: Browser | undefined;
  try {
    gateway = await startGateway(
      [
        'gateway:',
        '  nodename: web-bench',
        '  data_dir: DATA_DIR',
        '  log: { format: json }',
        'auth_service:',
        '  listen_addr: 127.0.0.1:0',
        'proxy_service:',
        `  web_listen_addr: 127.0.0.1:${webPort}`,
        '  https_keypairs:',
        `    - { cert_file: ${cert.certPath}, key_file: ${cert.keyPath} }`,
        '',
      ].join('\n'),
    );
    nginx = await startNginx(dir, nginxPort, cert);
    const home = join(dir, 'home');
    await makeNssDb(home, [pki.caPem]);
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home },
    });
    const peers = { gateway: `https://127.0.0.1:${webPort}`, nginx: `https://127.0.0.1:${nginxPort}` } as const;
    const loads: Record<keyof typeof peers, Load[]> = { gateway: [], nginx: [] };
    // Warm both servers (and Chromium's own first-start costs) once, not counted.
    for (const base of Object.values(peers)) await loadOnce(browser, base);
    for (let i = 0; i < RUNS; i++) {
      const order = (i % 2 === 0 ? ['gateway', 'nginx'] : ['nginx', 'gateway']) as (keyof typeof peers)[];
      for (const who of order) loads[who].push(await loadOnce(browser, peers[who]));
    }
    const nginxVersion = spawnSync(NGINX, ['-v'], { encoding: 'utf8' }).stderr.trim().replace(/^nginx version: /, '');
    const chromiumVersion = spawnSync(CHROMIUM, ['--version'], { encoding: 'utf8' }).stdout.trim();
    const section = report(loads, { loadBefore, nginxVersion, chromiumVersion });
    console.log(section);
    if (RECORD) await recordSection('web', section);
  } finally {
    await browser?.close().catch(() => undefined);
    nginx?.kill('SIGTERM');
    await gateway?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

function report(loads: Record<'gateway' | 'nginx', Load[]>, m: { loadBefore: number; nginxVersion: string; chromiumVersion: string }): string {
  const ms = (x: number) => `${x.toFixed(1)} ms`;
  const row = (label: string, pick: (l: Load) => number, fmt = ms) => {
    const g = median(loads.gateway.map(pick));
    const n = median(loads.nginx.map(pick));
    return `| ${label} | ${fmt(g)} | ${fmt(n)} | ${(g / n).toFixed(2)}x |`;
  };
  const all = bundleBytes(WEB_DIR);
  const first = firstPageBytes(WEB_DIR);
  const kib = (b: number) => `${(b / 1024).toFixed(1)} KiB`;
  return [
    '## web',
    '',
    `The Web UI's first page (${FIRST_PAGE}) in Chromium, cold (a new browser context per load), ${RUNS} loads per server taking turns; medians. Goal: under 1 s on this machine.`,
    '',
    '| figure | gateway | nginx (same files) | ratio |',
    '|---|---|---|---|',
    row('navigation start → connection start (browser side)', (l) => l.beforeConnect),
    row('connection → first byte (TCP + TLS + answer)', (l) => l.firstByte),
    row('DOM ready', (l) => l.domReady),
    row('load (scripts and styles run)', (l) => l.load),
    row('sign-in form rendered', (l) => l.form),
    row('bytes transferred', (l) => l.transferred, kib),
    '',
    `Bundle (dist/web/): ${all.files} files, ${kib(all.raw)} raw, ${kib(all.gz)} gzip, ${kib(all.br)} brotli. ` +
      `What the first page fetches (index.html and the files it names): ${kib(first.raw)} raw, ${kib(first.gz)} gzip, ${kib(first.br)} brotli.`,
    '',
    `Machine: ${m.chromiumVersion}, ${m.nginxVersion} (Debian, nginx-light: gzip_static, no brotli), TLS 1.3 and HTTP/2 on both; load average ${m.loadBefore.toFixed(2)} at the start, ${loadavg()[0]!.toFixed(2)} at the end.`,
    '',
  ].join('\n');
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
