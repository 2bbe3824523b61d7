/**
 * A unified diff of two texts, line by line, as `gwctl apply` shows an update (`diff -u` style: `---`, `+++`,
 * `@@ -a,b +c,d @@` hunks with three lines of context).
 *
 * Written here because no diff library is among the project's dependencies and this one is small: the common
 * head and tail are cut first, then the longest common subsequence of what is left (dynamic programming). It is
 * bounded: when the middle of both texts holds more than MAX_CELLS line pairs, the whole middle is shown as
 * removed and added (a correct diff, only not a minimal one), so a huge resource costs linear time, never
 * quadratic memory.
 */

const CONTEXT = 3;
/** Line pairs the LCS table may hold (4 MB of Uint32). */
const MAX_CELLS = 1_000_000;

type Op = { type: ' ' | '-' | '+'; line: string };

/** The edit script from a to b: unchanged lines, removals and additions, in order. */
function editScript(a: readonly string[], b: readonly string[]): Op[] {
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  const midA = a.slice(head, a.length - tail);
  const midB = b.slice(head, b.length - tail);
  const ops: Op[] = a.slice(0, head).map((line) => ({ type: ' ', line }));
  ops.push(...middle(midA, midB));
  ops.push(...a.slice(a.length - tail).map((line): Op => ({ type: ' ', line })));
  return ops;
}

function middle(a: readonly string[], b: readonly string[]): Op[] {
  const n = a.length;
  const m = b.length;
  if (n === 0 || m === 0 || (n + 1) * (m + 1) > MAX_CELLS) {
    return [...a.map((line): Op => ({ type: '-', line })), ...b.map((line): Op => ({ type: '+', line }))];
  }
  // lcs[i][j]: the LCS length of a[i..] and b[j..], row-major in one array.
  const w = m + 1;
  const lcs = new Uint32Array((n + 1) * w);
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i * w + j] = a[i] === b[j] ? lcs[(i + 1) * w + j + 1]! + 1 : Math.max(lcs[(i + 1) * w + j]!, lcs[i * w + j + 1]!);
    }
  }
  const ops: Op[] = [];
  let i = 0;
  let j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) {
      ops.push({ type: ' ', line: a[i++]! });
      j++;
    } else if (lcs[(i + 1) * w + j]! >= lcs[i * w + j + 1]!) {
      ops.push({ type: '-', line: a[i++]! });
    } else {
      ops.push({ type: '+', line: b[j++]! });
    }
  }
  while (i < n) ops.push({ type: '-', line: a[i++]! });
  while (j < m) ops.push({ type: '+', line: b[j++]! });
  return ops;
}

function lines(text: string): string[] {
  if (text === '') return [];
  const split = text.split('\n');
  if (split[split.length - 1] === '') split.pop();
  return split;
}

/** The unified diff from before to after ('' when they are equal), headed with the two labels. */
export function unifiedDiff(before: string, after: string, labels: { before: string; after: string }): string {
  if (before === after) return '';
  const ops = editScript(lines(before), lines(after));
  const out = [`--- ${labels.before}`, `+++ ${labels.after}`];
  // Hunks: runs of changes with CONTEXT lines around them, merged when their contexts touch.
  let k = 0;
  while (k < ops.length) {
    while (k < ops.length && ops[k]!.type === ' ') k++;
    if (k >= ops.length) break;
    const start = Math.max(0, k - CONTEXT);
    let end = k;
    for (;;) {
      while (end < ops.length && ops[end]!.type !== ' ') end++;
      let next = end;
      while (next < ops.length && ops[next]!.type === ' ') next++;
      if (next < ops.length && next - end <= 2 * CONTEXT) end = next;
      else break;
    }
    const stop = Math.min(ops.length, end + CONTEXT);
    const hunk = ops.slice(start, stop);
    const beforeStart = ops.slice(0, start).filter((o) => o.type !== '+').length;
    const afterStart = ops.slice(0, start).filter((o) => o.type !== '-').length;
    const beforeLen = hunk.filter((o) => o.type !== '+').length;
    const afterLen = hunk.filter((o) => o.type !== '-').length;
    out.push(`@@ -${beforeLen === 0 ? beforeStart : beforeStart + 1},${beforeLen} +${afterLen === 0 ? afterStart : afterStart + 1},${afterLen} @@`);
    for (const o of hunk) out.push(`${o.type}${o.line}`);
    k = stop;
  }
  return `${out.join('\n')}\n`;
}
