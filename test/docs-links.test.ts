/**
 * The documentation's links stay inside the repository and lead somewhere. For every Markdown page (README.md and
 * docs/*.md), every link ([text](target), ![image](target), [label]: target) that is not a web address must be a
 * relative path that resolves to a file or folder of this repository, and a `#fragment` must name a heading of the
 * page it points to (GitHub's anchors). A link to an absolute path, a file: URL or a path that climbs out of the
 * repository is refused, and so is a path in code that starts with ../ (`../somewhere/file.md`) and does not name a
 * file of the repository: a reader of the repository alone cannot open either. Links inside fenced code blocks and code spans are not links.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** The pages checked, as paths relative to the repository. */
function pages(): string[] {
  const docs = readdirSync(join(root, 'docs')).filter((name) => name.endsWith('.md')).map((name) => `docs/${name}`);
  return ['README.md', ...docs.sort()];
}

/** The page's text without its fenced code blocks (replaced by blank lines, so line numbers stay right). */
function withoutFences(text: string): string {
  let inFence: string | undefined;
  return text
    .split('\n')
    .map((line) => {
      const fence = /^\s*(```+|~~~+)/.exec(line)?.[1];
      if (inFence !== undefined) {
        if (fence !== undefined && fence[0] === inFence[0] && fence.length >= inFence.length) inFence = undefined;
        return '';
      }
      if (fence !== undefined) {
        inFence = fence;
        return '';
      }
      return line;
    })
    .join('\n');
}

interface Found {
  line: number;
  target: string;
}

/** Inline links and images, and reference definitions, outside code spans. */
function linksOf(text: string): Found[] {
  const found: Found[] = [];
  withoutFences(text)
    .split('\n')
    .forEach((raw, i) => {
      const line = raw.replace(/(`+)[\s\S]*?\1/g, (m) => ' '.repeat(m.length));
      for (const m of line.matchAll(/\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)/g)) found.push({ line: i + 1, target: m[1]! });
      const def = /^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$/.exec(line);
      if (def) found.push({ line: i + 1, target: def[1]! });
    });
  return found;
}

/** Paths in code spans that start with ../ and name a file: what a reader would try to open. */
function codePathsOf(text: string): Found[] {
  const found: Found[] = [];
  withoutFences(text)
    .split('\n')
    .forEach((line, i) => {
      for (const m of line.matchAll(/(`+)([\s\S]*?)\1/g)) {
        const code = m[2]!.trim();
        if (/^(\.\.\/)+[\w.-]+(\/[\w.-]+)*\.\w+$/.test(code)) found.push({ line: i + 1, target: code });
      }
    });
  return found;
}

/** GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces to hyphens. */
function slugOf(heading: string): string {
  return heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/[`*]/g, '')
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/** Every anchor a page offers (repeated headings get -1, -2, ... as on GitHub). */
function anchorsOf(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of withoutFences(text).split('\n')) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1];
    if (heading === undefined) continue;
    const slug = slugOf(heading);
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    anchors.add(n === 0 ? slug : `${slug}-${n}`);
  }
  return anchors;
}

const WEB = /^(https?|mailto):/i;

/** What is wrong with one link of a page, or undefined. */
function problemOf(page: string, target: string): string | undefined {
  if (WEB.test(target)) return undefined;
  if (/^[a-z][a-z0-9+.-]*:/i.test(target)) return 'a URL that is not a web address (file:, ...) leaves the repository';
  if (target.startsWith('/')) return 'an absolute path: not inside the repository for anyone else';
  const [pathPart, fragment] = target.split('#', 2) as [string, string | undefined];
  const path = decodeURIComponent(pathPart);
  const file = path === '' ? join(root, page) : resolve(root, dirname(page), path);
  const inRepo = relative(root, file);
  if (inRepo === '..' || inRepo.startsWith(`..${sep}`)) return `leaves the repository (${inRepo})`;
  if (!existsSync(file)) return `no such file in the repository: ${inRepo}`;
  if (fragment !== undefined && fragment !== '' && statSync(file).isFile() && file.endsWith('.md')) {
    if (!anchorsOf(readFileSync(file, 'utf8')).has(fragment)) return `${inRepo} has no heading with the anchor #${fragment}`;
  }
  return undefined;
}

describe('links in the documentation', () => {
  it.each(pages())('%s: every link leads to a file (and heading) of the repository', (page) => {
    const text = readFileSync(join(root, page), 'utf8');
    const problems = linksOf(text).flatMap(({ line, target }) => {
      const why = problemOf(page, target);
      return why === undefined ? [] : [`${page}:${line}: (${target}) ${why}`];
    });
    expect(problems).toEqual([]);
  });

  it.each(pages())('%s: a path in code that starts with ../ names a file of the repository', (page) => {
    const text = readFileSync(join(root, page), 'utf8');
    const problems = codePathsOf(text).flatMap(({ line, target }) => {
      const why = problemOf(page, target);
      return why === undefined ? [] : [`${page}:${line}: \`${target}\` ${why}`];
    });
    expect(problems).toEqual([]);
  });
});

describe('the link checker itself', () => {
  it('finds inline links, images and reference definitions, not links in code', () => {
    const text = ['see [a](a.md) and ![i](images/x.png "t")', '[ref]: b.md#x', '`[c](c.md)`', '```', '[d](d.md)', '```'].join('\n');
    expect(linksOf(text).map((f) => f.target)).toEqual(['a.md', 'images/x.png', 'b.md#x']);
  });

  it('refuses what leaves the repository or does not exist, takes what does', () => {
    expect(problemOf('docs/architecture.md', '../../shared/spec/seed.md')).toMatch(/^leaves the repository/);
    expect(problemOf('docs/architecture.md', '../shared/spec/seed.md')).toMatch(/^no such file/);
    expect(problemOf('docs/architecture.md', '/work/shared/ARCHITECTURE.md')).toMatch(/absolute path/);
    expect(problemOf('docs/architecture.md', 'file:///etc/passwd')).toMatch(/leaves the repository/);
    expect(problemOf('docs/architecture.md', 'bench/RESULTS.md')).toMatch(/no such file/);
    expect(problemOf('docs/architecture.md', 'proxy.md#no-such-heading-here')).toMatch(/no heading/);
    expect(problemOf('docs/architecture.md', '../bench/RESULTS.md')).toBeUndefined();
    expect(problemOf('docs/architecture.md', '../src/mux/')).toBeUndefined();
    expect(problemOf('README.md', 'docs/proxy.md')).toBeUndefined();
    expect(problemOf('docs/architecture.md', 'https://example.com/x')).toBeUndefined();
  });

  it('finds paths in code that climb, not other code', () => {
    const text = 'the spec `../shared/spec/seed.md`, a message `"../../.."`, a key `gateway/../../etc/x`';
    expect(codePathsOf(text).map((f) => f.target)).toEqual(['../shared/spec/seed.md']);
  });

  it('makes the anchors GitHub makes', () => {
    expect(slugOf('Proxy peering (`peer_listen_addr`, 3021)')).toBe('proxy-peering-peer_listen_addr-3021');
    expect(slugOf('Database users and names (`db_users`, `db_names`)')).toBe('database-users-and-names-db_users-db_names');
    expect(slugOf('The [web](web.md) surface')).toBe('the-web-surface');
  });
});
