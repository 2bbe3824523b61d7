/**
 * Reads the shell lines of the README the way a POSIX shell reads these simple ones, so that a test can run
 * them as written: words, '…' and "…" quoting, $NAME expansion (in double quotes and bare words), a trailing
 * `&`, a `# comment`, and `export NAME=value`. Anything else (pipes, redirections, `;`, `&&`, subshells,
 * `$(…)`) is refused with an error naming the line, so a README line the test cannot run faithfully fails
 * loudly instead of running as something else.
 */

export type ShellLine =
  | { kind: 'export'; name: string; value: string }
  | { kind: 'command'; argv: string[]; background: boolean };

const UNSUPPORTED = /[|;<>()`]|&&/;

function expand(text: string, env: Record<string, string | undefined>): string {
  return text.replace(/\$(\w+)|\$\{(\w+)\}/g, (_m, a: string | undefined, b: string | undefined) => env[(a ?? b)!] ?? '');
}

/** Splits one line into words, expanding variables from env. */
export function words(line: string, env: Record<string, string | undefined>): string[] {
  const out: string[] = [];
  let word: string | undefined;
  let i = 0;
  while (i < line.length) {
    const c = line[i]!;
    if (c === ' ' || c === '\t') {
      if (word !== undefined) out.push(word);
      word = undefined;
      i++;
    } else if (c === "'") {
      const end = line.indexOf("'", i + 1);
      if (end < 0) throw new Error(`unterminated ' in: ${line}`);
      word = (word ?? '') + line.slice(i + 1, end);
      i = end + 1;
    } else if (c === '"') {
      const end = line.indexOf('"', i + 1);
      if (end < 0) throw new Error(`unterminated " in: ${line}`);
      word = (word ?? '') + expand(line.slice(i + 1, end), env);
      i = end + 1;
    } else {
      let j = i;
      while (j < line.length && !` \t'"`.includes(line[j]!)) j++;
      word = (word ?? '') + expand(line.slice(i, j), env);
      i = j;
    }
  }
  if (word !== undefined) out.push(word);
  return out;
}

/** Removes a `# comment` that starts after a blank, outside quotes. */
function stripComment(line: string): string {
  let quote: string | undefined;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (quote) {
      if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"') {
      quote = c;
    } else if (c === '#' && (i === 0 || /\s/.test(line[i - 1]!))) {
      return line.slice(0, i);
    }
  }
  return line;
}

/** The lines of a shell code block; blank and comment-only lines are skipped. */
export function parseShell(block: string, env: Record<string, string | undefined>): ShellLine[] {
  const lines: ShellLine[] = [];
  for (const raw of block.split('\n')) {
    let line = stripComment(raw).trim();
    if (line === '') continue;
    const background = line.endsWith('&') && !line.endsWith('&&');
    if (background) line = line.slice(0, -1).trim();
    if (UNSUPPORTED.test(line.replace(/'[^']*'|"[^"]*"/g, ''))) throw new Error(`a README line the test cannot run as written: ${raw}`);
    const argv = words(line, env);
    if (argv[0] === 'export') {
      const m = /^(\w+)=(.*)$/s.exec(argv.slice(1).join(' '));
      if (!m || argv.length !== 2) throw new Error(`unsupported export: ${raw}`);
      lines.push({ kind: 'export', name: m[1]!, value: m[2]! });
      env[m[1]!] = m[2]!;
    } else {
      lines.push({ kind: 'command', argv, background });
    }
  }
  return lines;
}

/** The fenced code blocks of a markdown section (from its `## title` to the next `## `), in order. */
export function codeBlocks(markdown: string, sectionTitle: string): Array<{ lang: string; body: string }> {
  const start = markdown.indexOf(`\n## ${sectionTitle}`);
  if (start < 0) throw new Error(`no section "## ${sectionTitle}"`);
  const next = markdown.indexOf('\n## ', start + 4);
  const text = markdown.slice(start, next < 0 ? undefined : next);
  return [...text.matchAll(/```(\w*)\n([\s\S]*?)```/g)].map((m) => ({ lang: m[1]!, body: m[2]! }));
}
