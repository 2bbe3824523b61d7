/**
 * A real browser for the Web UI tests: Debian's Chromium (`/usr/bin/chromium`, installed by
 * scripts/install-test-deps.sh) driven by playwright-core. Nothing downloads a browser.
 *
 * TLS is checked as a user's browser checks it: the browser gets a HOME of its own whose NSS database
 * ($HOME/.pki/nssdb, where Chromium on Linux reads locally trusted roots) holds the test cluster's CA, made with
 * `certutil` (libnss3-tools). HTTPS errors are never ignored, so a page whose certificate the cluster's CA did
 * not issue (or whose name it does not hold) fails to load, as it would for a user.
 *
 * Host names: `--host-resolver-rules` maps names (by default `*.gateway.test`) to an address, so that the Proxy's
 * name and the HTTP apps' public names (SNI, Host) reach the Proxy's web port without /etc/hosts.
 *
 * Screenshots go to test-results/web/<suite>/<NN>-<step>.png (git-ignored); `step()` saves one after each step,
 * and one named `<step>-failed` when the step throws, so a failing run shows what was on the screen.
 *
 * One browser per test file; pages are reused between steps; waits are for selectors, never fixed sleeps.
 *
 * The network: Chromium aborts loads with ERR_NETWORK_CHANGED when the machine's interfaces change, which other work
 * on a shared machine does. `npm test` and `npm run test:browser` run the browser files in a network namespace of
 * their own (scripts/netns-run.sh, as root), daemons and test servers included; launchBrowser() says on stderr when
 * it runs where other interfaces than loopback can be seen (networkIsolated()), e.g. as a normal user.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';

const run = promisify(execFile);

/** Debian's package `chromium`; its launcher script sources /etc/chromium.d and execs /usr/lib/chromium/chromium. */
export const CHROMIUM = '/usr/bin/chromium';

/** Where screenshots go: <repo>/test-results/web/. */
export const SCREENSHOT_ROOT = new URL('../../test-results/web/', import.meta.url).pathname;

export interface BrowserOptions {
  /** Names the screenshot directory: test-results/web/<suite>/. */
  suite: string;
  /** PEM CA certificates the browser trusts (besides none: the NSS database starts empty). */
  trust?: string[];
  /** Host name patterns (Chromium's syntax: `*.gateway.test`, `proxy.gw.test`) → address. */
  hosts?: Record<string, string>;
  /** More Chromium flags, e.g. `--disable-http2` to speak HTTP/1.1 only. */
  args?: string[];
  /** Viewport of every page; 1280x800 unless given. */
  viewport?: { width: number; height: number };
}

export interface PageLog {
  /** console.error messages and uncaught exceptions of the page, e.g. a Content-Security-Policy violation. */
  errors: string[];
  /** Every answer of status 400 or more (`<status> <method> <url>`), and every request that failed outright. */
  failed: string[];
}

export interface TestBrowser {
  browser: Browser;
  /** The first context's page, for tests that need one only. */
  page: Page;
  context: BrowserContext;
  /** A new context (its own cookies and storage: another user) with one page; a viewport of its own if given. */
  newPage(options?: { viewport?: { width: number; height: number } }): Promise<{ context: BrowserContext; page: Page }>;
  /** What each page logged as an error (see PageLog). */
  log(page: Page): PageLog;
  /** Saves a full-page screenshot as test-results/web/<suite>/<NN>-<name>.png and returns its path. */
  shot(page: Page, name: string): Promise<string>;
  /** Runs fn, then saves a screenshot of page named after the step; on a throw, `<name>-failed`, and rethrows. */
  step<T>(page: Page, name: string, fn: () => Promise<T>): Promise<T>;
  /** The browser's HOME (its NSS database). */
  home: string;
  close(): Promise<void>;
}

/** A fresh NSS database under home/.pki/nssdb trusting each CA for TLS servers (trust flags C,,). */
export async function makeNssDb(home: string, cas: string[]): Promise<string> {
  const db = join(home, '.pki', 'nssdb');
  await mkdir(db, { recursive: true, mode: 0o700 });
  await run('certutil', ['-N', '-d', `sql:${db}`, '--empty-password']);
  for (const [i, pem] of cas.entries()) {
    const file = join(home, `ca-${i}.pem`);
    await writeFile(file, pem);
    await run('certutil', ['-A', '-d', `sql:${db}`, '-n', `gateway-test-ca-${i}`, '-t', 'C,,', '-i', file]);
  }
  return db;
}

/** Chromium's flags: headless, quiet (no background fetches, no updates, no sync), nothing shared between runs. */
export function chromiumArgs(hosts: Record<string, string>): string[] {
  const rules = Object.entries(hosts).map(([pattern, address]) => `MAP ${pattern} ${address}`);
  return [
    '--headless',
    // The sandbox needs user namespaces Chromium refuses to use as root; tests run as root in CI.
    ...(process.getuid?.() === 0 ? ['--no-sandbox'] : []),
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--no-default-browser-check',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--disable-dev-shm-usage',
    '--no-proxy-server',
    '--password-store=basic',
    ...(rules.length > 0 ? [`--host-resolver-rules=${rules.join(', ')}`] : []),
  ];
}

/** The links of the namespace scripts/netns-run.sh makes: loopback and its own veth pair. */
const ISOLATED_LINKS = new Set(['lo', 'gwisol0', 'gwisol1']);

/**
 * Whether this process sees no network interface but those of the network namespace of its own that
 * scripts/netns-run.sh gives the browser tests, where no change of the machine's network can reach Chromium.
 */
export function networkIsolated(): boolean {
  return Object.keys(networkInterfaces()).every((name) => ISOLATED_LINKS.has(name));
}

let warned = false;

/** A phone's screen (CSS pixels) for the layout tests, and the desktop one every page gets by default. */
export const PHONE = { width: 390, height: 844 } as const;
export const DESKTOP = { width: 1280, height: 800 } as const;

/**
 * Layout facts of the page as it stands, for assertions (never pixels): whether the page is wider than the screen
 * (document.scrollingElement.scrollWidth > innerWidth), and each table box (.table-scroll) whether its table is
 * wider than the box and the box scrolls sideways to show it.
 */
export async function layoutFacts(page: Page): Promise<{ innerWidth: number; scrollWidth: number; tableBoxes: Array<{ overflows: boolean; scrolls: boolean; inside: boolean }> }> {
  return page.evaluate(() => {
    const root = document.scrollingElement ?? document.documentElement;
    const boxes = Array.from(document.querySelectorAll<HTMLElement>('.table-scroll')).map((box) => {
      const style = getComputedStyle(box);
      const rect = box.getBoundingClientRect();
      return {
        overflows: box.scrollWidth > box.clientWidth,
        scrolls: style.overflowX === 'auto' || style.overflowX === 'scroll',
        inside: rect.left >= 0 && rect.right <= window.innerWidth + 0.5,
      };
    });
    return { innerWidth: window.innerWidth, scrollWidth: root.scrollWidth, tableBoxes: boxes };
  });
}

/** Launches Chromium with its own HOME and a fresh user data directory; close() removes both. */
export async function launchBrowser(options: BrowserOptions): Promise<TestBrowser> {
  if (!networkIsolated() && !warned) {
    warned = true;
    process.stderr.write(
      `browser tests: Chromium sees this machine's network (${Object.keys(networkInterfaces()).join(', ')}): a change of it during the run ` +
        'fails page loads with ERR_NETWORK_CHANGED. As root, run them in a namespace of their own: npm run test:browser ' +
        '(or bash scripts/netns-run.sh npx vitest run <files>).\n',
    );
  }
  const home = await mkdtemp(join(tmpdir(), 'gw-browser-'));
  await makeNssDb(home, options.trust ?? []);
  const shotDir = join(SCREENSHOT_ROOT, options.suite);
  await rm(shotDir, { recursive: true, force: true });
  await mkdir(shotDir, { recursive: true });
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Playwright gives Chromium a fresh --user-data-dir of its own (a temporary directory it removes on close).
    args: [...chromiumArgs(options.hosts ?? { '*.gateway.test': '127.0.0.1' }), ...(options.args ?? [])],
    // Only what Chromium needs: its HOME (the NSS database), no proxy variables of the developer's shell.
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home, LANG: 'C.UTF-8', TZ: 'UTC' },
    timeout: 60_000,
  });
  const logs = new WeakMap<Page, PageLog>();
  const viewport = options.viewport ?? DESKTOP;
  const newPage = async (pageOptions: { viewport?: { width: number; height: number } } = {}): Promise<{ context: BrowserContext; page: Page }> => {
    // ignoreHTTPSErrors stays false: the NSS database is what makes the cluster's certificate trusted.
    const context = await browser.newContext({ viewport: pageOptions.viewport ?? viewport, ignoreHTTPSErrors: false, locale: 'en-US', timezoneId: 'UTC' });
    const page = await context.newPage();
    const log: PageLog = { errors: [], failed: [] };
    page.on('console', (m) => {
      if (m.type() === 'error') log.errors.push(`${m.text()}${m.location().url ? ` (${m.location().url})` : ''}`);
    });
    page.on('pageerror', (e) => log.errors.push(String(e)));
    page.on('response', (r) => {
      if (r.status() >= 400) log.failed.push(`${r.status()} ${r.request().method()} ${r.url()}`);
    });
    page.on('requestfailed', (r) => log.failed.push(`${r.failure()?.errorText ?? 'failed'} ${r.method()} ${r.url()}`));
    logs.set(page, log);
    return { context, page };
  };
  const first = await newPage();
  let count = 0;
  const shot = async (page: Page, name: string): Promise<string> => {
    const path = join(shotDir, `${String(++count).padStart(2, '0')}-${name.replace(/[^a-z0-9._-]+/gi, '-')}.png`);
    await page.screenshot({ path, fullPage: true });
    return path;
  };
  return {
    browser,
    page: first.page,
    context: first.context,
    newPage,
    log: (page) => logs.get(page) ?? { errors: [], failed: [] },
    shot,
    async step(page, name, fn) {
      try {
        const result = await fn();
        await shot(page, name);
        return result;
      } catch (err) {
        await shot(page, `${name}-failed`).catch(() => undefined);
        throw err;
      }
    },
    home,
    async close() {
      await browser.close().catch(() => undefined);
      await rm(home, { recursive: true, force: true });
    },
  };
}
