/**
 * The Web UI's build as `npm run build` makes it (vite build of web/, then scripts/compress-web.mjs), into a
 * scratch directory: hashed assets, nothing inline that the Content-Security-Policy would refuse, xterm.js in a
 * chunk of its own that the first page does not load, its <style> elements rewritten, and precompressed copies
 * that decompress to the very bytes of each file. The hostile case: the page's own sources are searched for what
 * the CSP forbids (inline scripts, <style>, style attributes), and the xterm rewrite refuses to pass silently.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { brotliDecompressSync, gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isXtermModule, rewriteXtermStyles, XTERM_STYLE_TAG } from '../../web/build/xterm-csp.js';

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : [join(dir, e.name)]));
}

describe('the xterm.js rewrite for the CSP', () => {
  it('finds and rewrites every <style> the installed xterm.js creates', () => {
    const code = readFileSync(join(ROOT, 'node_modules/@xterm/xterm/lib/xterm.mjs'), 'utf8');
    const out = rewriteXtermStyles(code);
    expect(out.count).toBeGreaterThan(0);
    expect(out.code).not.toMatch(/createElement\(["'`]style["'`]\)/);
    expect(out.code).toContain(`createElement("${XTERM_STYLE_TAG}")`);
  });

  it('touches only xterm.js itself; text without such a call comes back unchanged with a count of 0', () => {
    expect(isXtermModule('/x/node_modules/@xterm/xterm/lib/xterm.mjs')).toBe(true);
    expect(isXtermModule('/x/node_modules/@xterm/xterm/lib/xterm.mjs?v=123')).toBe(true);
    expect(isXtermModule('/x/node_modules/@xterm/addon-fit/lib/addon-fit.mjs')).toBe(false);
    expect(isXtermModule('/x/web/src/xterm.mjs')).toBe(false);
    expect(rewriteXtermStyles('document.createElement("div")')).toEqual({ code: 'document.createElement("div")', count: 0 });
  });
});

describe('the page sources keep to the CSP', () => {
  const sources = files(join(ROOT, 'web/src')).concat(join(ROOT, 'web/index.html'));

  it('no inline script, no <style>, no style attribute, nothing from another origin', () => {
    const offences: string[] = [];
    for (const f of sources) {
      const text = readFileSync(f, 'utf8');
      const where = relative(ROOT, f);
      if (/<script(?![^>]*\bsrc=)[^>]*>/i.test(text)) offences.push(`${where}: inline <script>`);
      if (/<style[\s>]/i.test(text)) offences.push(`${where}: <style>`);
      if (/\sstyle=/.test(text)) offences.push(`${where}: style attribute`);
      if (/\bon[a-z]+="/.test(text) && f.endsWith('.html')) offences.push(`${where}: inline event handler`);
      if (/(?:src|href)=["']https?:\/\//i.test(text) || /@import\s+url\(["']?https?:/i.test(text)) offences.push(`${where}: a resource of another origin`);
      if (/\binnerHTML\b|dangerouslySetInnerHTML|\beval\(|new Function\(/.test(text)) offences.push(`${where}: HTML or code from a string`);
    }
    expect(offences).toEqual([]);
  });
});

describe('npm run build of the page', () => {
  let out: string;
  let all: string[];
  beforeAll(async () => {
    out = mkdtempSync(join(tmpdir(), 'gw-web-build-'));
    await run(process.execPath, [join(ROOT, 'node_modules/vite/bin/vite.js'), 'build', '--config', join(ROOT, 'web/vite.config.ts'), '--outDir', out, '--emptyOutDir'], { cwd: ROOT });
    await run(process.execPath, [join(ROOT, 'scripts/compress-web.mjs'), out], { cwd: ROOT });
    all = files(out).map((f) => relative(out, f));
  }, 120_000);
  afterAll(() => {
    if (out) rmSync(out, { recursive: true, force: true });
  });

  it('index.html loads only hashed assets of /web/assets/, nothing inline', () => {
    const index = readFileSync(join(out, 'index.html'), 'utf8');
    const linked = [...index.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!).filter((u) => !u.startsWith('data:'));
    expect(linked.length).toBeGreaterThanOrEqual(2);
    for (const u of linked) expect(u).toMatch(/^\/web\/assets\/[\w-]+-[\w-]{8}\.(js|css)$/);
    expect(index).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/);
    expect(index).not.toMatch(/<style|\sstyle=/);
    for (const u of linked) expect(all).toContain(u.slice('/web/'.length));
  });

  it('xterm.js is a chunk of its own, not loaded by the first page, with its <style> elements rewritten', () => {
    const index = readFileSync(join(out, 'index.html'), 'utf8');
    const chunks = all.filter((f) => f.startsWith('assets/') && f.endsWith('.js'));
    const terminal = chunks.filter((f) => readFileSync(join(out, f), 'utf8').includes('xterm-helper-textarea'));
    expect(terminal).toHaveLength(1);
    expect(index).not.toContain(terminal[0]!);
    const text = readFileSync(join(out, terminal[0]!), 'utf8');
    expect(text).toContain(XTERM_STYLE_TAG);
    expect(text).not.toMatch(/createElement\(["'`]style["'`]\)/);
  });

  it('every text asset has a .br and a .gz that decompress to its exact bytes', () => {
    const originals = all.filter((f) => /\.(html|js|css)$/.test(f));
    expect(originals.length).toBeGreaterThanOrEqual(4);
    for (const f of originals) {
      const data = readFileSync(join(out, f));
      if (existsSync(join(out, `${f}.br`))) expect(brotliDecompressSync(readFileSync(join(out, `${f}.br`))).equals(data)).toBe(true);
      if (existsSync(join(out, `${f}.gz`))) expect(gunzipSync(readFileSync(join(out, `${f}.gz`))).equals(data)).toBe(true);
      // Only a file too small to gain from compression goes without.
      if (data.length > 1024) expect(existsSync(join(out, `${f}.br`)) && existsSync(join(out, `${f}.gz`))).toBe(true);
    }
  });

  it('the first page stays small: under 40 KiB of brotli for index.html and what it links', async () => {
    const linked = [...readFileSync(join(out, 'index.html'), 'utf8').matchAll(/(?:src|href)="\/web\/(assets\/[^"]+)"/g)].map((m) => m[1]!);
    const br = ['index.html', ...linked].map((f) => (existsSync(join(out, `${f}.br`)) ? readFileSync(join(out, `${f}.br`)).length : readFileSync(join(out, f)).length));
    expect(br.reduce((a, b) => a + b, 0)).toBeLessThan(40 * 1024);
  });
});
