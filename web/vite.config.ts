// The Web UI's build: web/ → dist/web/, served by the Proxy at /web/ (docs/web.md).
import { fileURLToPath } from 'node:url';
import { defineConfig, type Plugin } from 'vite';
import { isXtermModule, rewriteXtermStyles } from './build/xterm-csp.ts';

const here = fileURLToPath(new URL('.', import.meta.url));

/** xterm.js's <style> elements become <gw-xterm-style> (see build/xterm-csp.ts); the build fails if none is found. */
function xtermCsp(): Plugin {
  let seen = 0;
  return {
    name: 'gateway-xterm-csp',
    enforce: 'pre',
    transform(code, id) {
      if (!isXtermModule(id)) return null;
      const out = rewriteXtermStyles(code);
      seen += out.count;
      return { code: out.code, map: null };
    },
    buildEnd(error) {
      if (!error && seen === 0) this.error('xterm.js no longer creates <style> elements as build/xterm-csp.ts expects: the terminal would break under the CSP');
    },
  };
}

export default defineConfig({
  root: here,
  base: '/web/',
  publicDir: false,
  logLevel: 'warn',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  plugins: [xtermCsp()],
  build: {
    outDir: fileURLToPath(new URL('../dist/web/', import.meta.url)),
    emptyOutDir: true,
    assetsDir: 'assets',
    target: 'es2022',
    sourcemap: false,
    // Only modern browsers run this page: no modulepreload polyfill.
    modulePreload: { polyfill: false },
    // The terminal (xterm.js) is a chunk of its own, loaded when a terminal opens; above that, warn.
    chunkSizeWarningLimit: 400,
    reportCompressedSize: false,
  },
});
