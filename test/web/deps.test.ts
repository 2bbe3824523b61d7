/**
 * The Web UI's packages are build-time only: the Vite build bundles them into dist/web/, which the Proxy serves as
 * static files, so they are devDependencies and the packages (scripts/package/stage.mjs copies the non-dev ones)
 * do not ship them. The hostile cases: a package the page imports listed as a runtime dependency, and a file of
 * src/ (what the daemon runs) importing one of them, which would then be missing from an installed package.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

function files(dir: string, ext: RegExp): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name), ext) : ext.test(e.name) ? [join(dir, e.name)] : []));
}

/** The packages a source file imports (bare specifiers, by package name: 'preact/hooks' is preact). */
export function packagesImported(text: string): string[] {
  const out = new Set<string>();
  for (const m of text.matchAll(/(?:^|\s)(?:import|export)\s[^'"]*?from\s+['"]([^'".][^'"]*)['"]|import\(\s*['"]([^'".][^'"]*)['"]\s*\)/g)) {
    const spec = (m[1] ?? m[2])!;
    if (spec.startsWith('node:')) continue;
    const parts = spec.split('/');
    out.add(spec.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!);
  }
  return [...out];
}

const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string>; devDependencies: Record<string, string> };
const webPackages = [...new Set(files(join(ROOT, 'web/src'), /\.tsx?$/).flatMap((f) => packagesImported(readFileSync(f, 'utf8'))))].sort();

describe('the Web UI packages', () => {
  it('reads bare imports and leaves relative and node: ones out (so that the checks below cannot pass by finding nothing)', () => {
    expect(packagesImported(`import { h } from 'preact';\nimport { useState } from 'preact/hooks';\nimport { FitAddon } from '@xterm/addon-fit';\nimport x from './x.js';\nimport { join } from 'node:path';\nconst t = await import('@xterm/xterm');\n`)).toEqual(['preact', '@xterm/addon-fit', '@xterm/xterm']);
    expect(webPackages).toEqual(expect.arrayContaining(['preact', '@xterm/xterm', '@xterm/addon-fit']));
  });

  it('are devDependencies, not dependencies: the build bundles them and the packages do not ship them', () => {
    for (const name of webPackages) {
      expect(pkg.dependencies[name], `${name} is a runtime dependency`).toBeUndefined();
      expect(pkg.devDependencies[name], `${name} is not a devDependency`).toBeDefined();
    }
  });

  it('are imported by nothing in src/ (what the daemon runs)', () => {
    const used = files(join(ROOT, 'src'), /\.ts$/).flatMap((f) => packagesImported(readFileSync(f, 'utf8')).filter((p) => webPackages.includes(p)).map((p) => `${f.slice(ROOT.length)}: ${p}`));
    expect(used).toEqual([]);
  });
});
