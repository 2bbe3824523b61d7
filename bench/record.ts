/**
 * Shared by the bench:* scripts: writes one section of bench/RESULTS.md and its chart, bench/<section>.svg (the
 * gateway against its peers, one group of bars per figure), linked from the section.
 *
 * `npx tsx bench/record.ts --charts` re-renders every chart from bench/RESULTS.md as it is (adding a missing link)
 * and the README's headline table (between `<!-- bench:headline -->` and `<!-- /bench:headline -->`), without
 * running a benchmark.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const BENCH_DIR = fileURLToPath(new URL('.', import.meta.url));
const INTRO =
  '# Benchmark results\n\nEach section is rewritten by its `npm run bench:*` script, with its chart (`bench/<section>.svg`); figures are from one run on the machine named. ' +
  '`npx tsx bench/record.ts --charts` redraws every chart from this file and refreshes the headline table in README.md.\n\n';

/** Replaces (or appends) one "## name" section of bench/RESULTS.md, keeping the others, and writes its chart. */
export async function recordSection(name: string, section: string, chart?: ChartSpec): Promise<void> {
  await recordSectionIn(BENCH_DIR, name, section, chart);
}

/** recordSection on dir/RESULTS.md and dir/<name>.svg. The chart is `chart`, or drawn from the section's first table. */
export async function recordSectionIn(dir: string, name: string, section: string, chart?: ChartSpec): Promise<void> {
  const path = join(dir, 'RESULTS.md');
  let text = INTRO;
  try {
    text = await readFile(path, 'utf8');
  } catch {
    // first run
  }
  const spec = chart ?? chartFromMarkdown(name, section);
  const body = spec ? withChartLink(name, section) : section;
  const re = new RegExp(`## ${escapeRegExp(name)}\\n[\\s\\S]*?(?=\\n## |$)`);
  text = re.test(text) ? text.replace(re, () => body.trimEnd() + '\n') : `${text.trimEnd()}\n\n${body.trimEnd()}\n`;
  await writeFile(path, text);
  if (spec) await writeFile(join(dir, `${name}.svg`), renderChart(spec));
}

const escapeRegExp = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** The section with `![name](name.svg)` right after its heading line (once). */
export function withChartLink(name: string, section: string): string {
  const link = `![${name}](${name}.svg)`;
  if (section.includes(link)) return section;
  const nl = section.indexOf('\n');
  if (nl < 0) return `${section}\n\n${link}\n`;
  return `${section.slice(0, nl)}\n\n${link}\n${section.slice(nl + 1).replace(/^(?!\n)/, '\n')}`;
}

// ---------------------------------------------------------------------------------------------------------------
// Tables

export interface Table {
  header: string[];
  rows: string[][];
}

/** At most this many rows and columns of a table are read; a chart of more would not be readable anyway. */
const MAX_ROWS = 40;
const MAX_COLUMNS = 12;

const cells = (line: string) =>
  line
    .trim()
    .replace(/^\|/, '')
    .replace(/\|$/, '')
    .split('|')
    .slice(0, MAX_COLUMNS)
    .map((c) => c.trim());

/** The first markdown table of text (a header row, a |---| row, then rows), or undefined. */
export function parseFirstTable(text: string): Table | undefined {
  const lines = text.split('\n');
  for (let i = 0; i + 1 < lines.length; i++) {
    if (!lines[i]!.trim().startsWith('|') || !/^\s*\|?\s*:?-{3,}/.test(lines[i + 1]!)) continue;
    const header = cells(lines[i]!);
    const rows: string[][] = [];
    for (let j = i + 2; j < lines.length && lines[j]!.trim().startsWith('|') && rows.length < MAX_ROWS; j++) rows.push(cells(lines[j]!));
    return { header, rows };
  }
  return undefined;
}

/** A cell's number: the number it starts with ("460 (73 + 387)" is 460), else the first one standing alone ("p50 0.97 ms" is 0.97). */
export function cellNumber(cell: string): number | undefined {
  const m = /^\s*(-?\d+(?:\.\d+)?)/.exec(cell) ?? /(?:^|\s)(-?\d+(?:\.\d+)?)(?=$|[\s,;)%])/.exec(cell);
  if (!m) return undefined;
  const n = Number(m[1]);
  return Number.isFinite(n) ? n : undefined;
}

/** "A 1 KiB (5 agents), B 2 KiB" holds two figures; a cell that starts with its number is one ("460 (73 + 387)"). */
function cellParts(cell: string): string[] {
  if (/^\s*-?\d/.test(cell) || !cell.includes(', ')) return [cell];
  const parts = cell.split(', ');
  return parts.every((p) => cellNumber(p) !== undefined) ? parts : [cell];
}

// ---------------------------------------------------------------------------------------------------------------
// Charts

export type SeriesKind = 'ours' | 'peer' | 'baseline';

export interface ChartSeries {
  name: string;
  kind: SeriesKind;
}

export interface ChartBar {
  series: number;
  /** undefined: no figure for this series ("–"); the text is shown without a bar. */
  value: number | undefined;
  text: string;
}

export interface ChartRow {
  label: string;
  bars: ChartBar[];
  /** The ratio columns, e.g. "gateway / OpenSSH: 0.57x". */
  notes: string[];
}

export interface ChartSpec {
  title: string;
  subtitle?: string;
  series: ChartSeries[];
  rows: ChartRow[];
}

/** A column or row naming a peer (another program doing the same job) or a baseline (no gateway in the path). */
export function seriesKind(name: string): SeriesKind {
  if (/\(peer\)|openssh|haproxy|socat/i.test(name)) return 'peer';
  if (/^(raw|direct)\b/i.test(name)) return 'baseline';
  return 'ours';
}

const NO_FIGURE = /^[-–—]?$/;

/** A column "p99 (ms)" right after "watch p50, same backend (ms)" is "watch p99, same backend (ms)" on its own. */
function fullLabel(header: string, previous: string): string {
  const m = /^(p\d+)\s*(\(.*\))?$/.exec(header);
  if (!m || !/\bp50\b/.test(previous)) return header;
  const label = previous.replace(/\bp50\b/, m[1]!);
  return m[2] ? label.replace(/\s*\([^()]*\)$/, '') + ` ${m[2]}` : label;
}

/**
 * The chart of a section's first table. A table whose first header is "figure" or "measure" has a row per figure
 * and a column per path (columns with " / " in their header are ratios, shown as text); any other table has a row
 * per path and a column per figure, and is turned around. undefined when there is no table or no number in it.
 */
export function chartFromMarkdown(name: string, section: string): ChartSpec | undefined {
  const table = parseFirstTable(section);
  if (!table || table.header.length < 2) return undefined;
  const byFigure = /^(figure|measure)$/i.test(table.header[0]!);
  const rows: ChartRow[] = [];
  let series: ChartSeries[];
  if (byFigure) {
    const valueCols = table.header.map((_, i) => i).filter((i) => i > 0 && !table.header[i]!.includes(' / '));
    const ratioCols = table.header.map((_, i) => i).filter((i) => i > 0 && table.header[i]!.includes(' / '));
    series = valueCols.map((i) => ({ name: table.header[i]!, kind: seriesKind(table.header[i]!) }));
    for (const r of table.rows) {
      const bars = valueCols.flatMap((col, s) => cellParts(r[col] ?? '').map((text) => ({ series: s, value: NO_FIGURE.test(text) ? undefined : cellNumber(text), text })));
      const notes = ratioCols.filter((c) => !NO_FIGURE.test(r[c] ?? '')).map((c) => `${table.header[c]}: ${r[c]}`);
      rows.push({ label: r[0] ?? '', bars, notes });
    }
  } else {
    series = table.rows.map((r) => ({ name: r[0] ?? '', kind: seriesKind(r[0] ?? '') }));
    for (let col = 1; col < table.header.length; col++) {
      const bars = table.rows.map((r, s) => ({ series: s, value: NO_FIGURE.test(r[col] ?? '') ? undefined : cellNumber(r[col] ?? ''), text: r[col] ?? '' }));
      rows.push({ label: fullLabel(table.header[col]!, table.header[col - 1]!), bars, notes: [] });
    }
  }
  const kept = rows.filter((r) => r.bars.some((b) => b.value !== undefined));
  if (kept.length === 0) return undefined;
  return { title: `bench: ${name}`, subtitle: 'bench/RESULTS.md; each figure\'s bars are scaled to its largest value', series, rows: kept };
}

const WIDTH = 800;
const MARGIN = 16;
const BAR_X = MARGIN;
const BAR_MAX = 430;
const BAR_H = 16;
const BAR_GAP = 4;
const NOTE_X = WIDTH - MARGIN;
const PALETTE: Record<SeriesKind, string[]> = {
  ours: ['#1f6feb', '#54aeff', '#0a3069', '#218bff'],
  peer: ['#e8590c', '#bf3989', '#9a6700', '#cf222e'],
  baseline: ['#8c959f', '#57606a', '#afb8c1', '#424a53'],
};
const FONT = "-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif";

/** Each series' colour: the gateway's blue (shades for more of ours), peers warm colours, baselines grey, in table order. */
export function seriesColours(series: ChartSeries[]): string[] {
  const used: Record<SeriesKind, number> = { ours: 0, peer: 0, baseline: 0 };
  return series.map((s) => {
    const p = PALETTE[s.kind];
    return p[used[s.kind]++ % p.length]!;
  });
}

export function escapeXml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c]!);
}

/** Text width estimate (px) for a sans-serif font: wide enough that wrapped lines fit. */
const textWidth = (s: string, size: number) => s.length * size * 0.58;

/** Words of s in lines of at most maxPx at the given font size (a single longer word gets a line of its own). */
export function wrap(s: string, maxPx: number, size: number): string[] {
  const lines: string[] = [];
  let line = '';
  for (const word of s.split(/\s+/).filter(Boolean)) {
    const next = line ? `${line} ${word}` : word;
    if (line && textWidth(next, size) > maxPx) {
      lines.push(line);
      line = word;
    } else line = next;
  }
  if (line) lines.push(line);
  return lines.length ? lines : [''];
}

const fmt = (n: number) => (Number.isInteger(n) ? String(n) : String(Math.round(n * 100) / 100));
const text = (x: number, y: number, s: string, attrs = '') => `<text x="${fmt(x)}" y="${fmt(y)}"${attrs ? ' ' + attrs : ''}>${escapeXml(s)}</text>`;

/** The title, the subtitle and the legend (wrapped over lines); returns the elements and the y below them. */
function renderHeader(spec: ChartSpec, colours: string[]): { out: string[]; y: number } {
  const out: string[] = [];
  let y = MARGIN + 16;
  out.push(text(MARGIN, y, spec.title, 'font-size="16" font-weight="bold"'));
  if (spec.subtitle) {
    y += 18;
    out.push(text(MARGIN, y, spec.subtitle, 'font-size="12" fill="#57606a"'));
  }
  y += 24;
  let x = MARGIN;
  spec.series.forEach((s, i) => {
    const w = 18 + textWidth(s.name, 12) + 16;
    if (x > MARGIN && x + w > WIDTH - MARGIN) {
      x = MARGIN;
      y += 20;
    }
    out.push(`<rect x="${fmt(x)}" y="${fmt(y - 11)}" width="12" height="12" rx="2" fill="${colours[i]}"/>`);
    out.push(text(x + 18, y, s.name, 'font-size="12"'));
    x += w;
  });
  return { out, y: y + 14 };
}

/** One figure: its label, a bar per series (scaled to the row's largest value) with the value, the ratios at the right. */
function renderRow(row: ChartRow, series: ChartSeries[], colours: string[], top: number): { out: string[]; y: number } {
  const out: string[] = [`<line x1="${MARGIN}" y1="${fmt(top)}" x2="${WIDTH - MARGIN}" y2="${fmt(top)}" stroke="#d0d7de"/>`];
  let y = top + 6;
  for (const line of wrap(row.label, WIDTH - 2 * MARGIN, 13)) {
    y += 16;
    out.push(text(MARGIN, y, line, 'font-size="13" font-weight="bold"'));
  }
  y += 6;
  const max = Math.max(0, ...row.bars.map((b) => b.value ?? 0));
  const barsTop = y;
  for (const bar of row.bars) {
    const name = series[bar.series]?.name ?? '';
    const len = bar.value === undefined || max <= 0 ? 0 : Math.max(bar.value > 0 ? 1 : 0, (Math.max(0, bar.value) / max) * BAR_MAX);
    if (bar.value !== undefined) {
      out.push(`<rect x="${BAR_X}" y="${fmt(y)}" width="${fmt(len)}" height="${BAR_H}" rx="2" fill="${colours[bar.series] ?? '#8c959f'}"><title>${escapeXml(`${name}: ${bar.text}`)}</title></rect>`);
    }
    const label = bar.value === undefined ? `${bar.text || '–'} (${name})` : bar.text;
    out.push(text(BAR_X + len + 6, y + BAR_H - 4, label, `font-size="12"${bar.value === undefined ? ' fill="#8c959f"' : ''}`));
    y += BAR_H + BAR_GAP;
  }
  let noteY = barsTop + BAR_H - 4;
  for (const note of row.notes) {
    out.push(text(NOTE_X, noteY, note, 'font-size="12" text-anchor="end" fill="#24292f"'));
    noteY += BAR_H + BAR_GAP;
  }
  return { out, y: Math.max(y, noteY - BAR_H + 4) + 6 };
}

/** The chart as a standalone SVG document: pure text, deterministic, every text escaped. */
export function renderChart(spec: ChartSpec): string {
  const colours = seriesColours(spec.series);
  const header = renderHeader(spec, colours);
  const body: string[] = [];
  let y = header.y;
  for (const row of spec.rows) {
    const r = renderRow(row, spec.series, colours, y);
    body.push(...r.out);
    y = r.y;
  }
  const height = Math.ceil(y + MARGIN);
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="${escapeXml(FONT)}">`,
    `<title>${escapeXml(spec.title)}</title>`,
    `<rect width="${WIDTH}" height="${height}" fill="#ffffff"/>`,
    ...header.out,
    ...body,
    '</svg>',
    '',
  ].join('\n');
}

// ---------------------------------------------------------------------------------------------------------------
// RESULTS.md as a whole, and the README's headline table

/** The "## name" sections of RESULTS.md, in order: name -> text from the heading to the next one. */
export function splitSections(results: string): Map<string, string> {
  const out = new Map<string, string>();
  // The name ends at a space or a colon ("## tunnel-metrics: the cost of ...").
  const re = /^## ([^\s:]+)[^\n]*\n[\s\S]*?(?=\n## |$(?![\s\S]))/gm;
  for (const m of results.matchAll(re)) out.set(m[1]!, m[0]);
  return out;
}

interface Headline {
  figure: string;
  section: string;
  row: RegExp;
  ours: RegExp;
  /** Peer columns in order of preference: the first one the table has is used. */
  peers: RegExp[];
}

const HEADLINES: Headline[] = [
  { figure: 'tunnel throughput, 1 stream (MiB/s, higher is better)', section: 'tunnel', row: /^throughput, 1 stream/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'tunnel 64-byte round trip p50 (µs, lower is better)', section: 'tunnel', row: /^64-byte round trip p50/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'Proxy memory per idle agent (KiB, lower is better)', section: 'tunnel', row: /^Proxy memory per idle/, ours: /^gateway$/, peers: [/openssh/i] },
  // The user path (issue 29): bench:tunnel's own figures (gwsh's default route, end to end) and, beside them, the
  // same path measured by hand with plain iperf3 (bench:userpath).
  { figure: 'user path iperf3, 1 stream, bench:tunnel (MiB/s, higher is better)', section: 'tunnel', row: /^user path: iperf3 throughput, 1 stream/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'user path iperf3, 1 stream, by hand: bench:userpath (Gbit/s, higher is better)', section: 'userpath', row: /^iperf3 1 stream/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'user path iperf3, 8 streams, bench:tunnel (MiB/s, higher is better)', section: 'tunnel', row: /^user path: iperf3 throughput, \d+ streams/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'user path iperf3, -P 8, by hand: bench:userpath (Gbit/s, higher is better)', section: 'userpath', row: /^iperf3 -P 8/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: "user path: the Proxy's CPU seconds per GiB (goal <= 1.0)", section: 'tunnel', row: /^user path: the Proxy daemon's CPU/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'user path: new connection + first echo (ms, lower is better)', section: 'tunnel', row: /^user path: new connection/, ours: /^gateway$/, peers: [/openssh/i] },
  { figure: 'multiplexer throughput, one TLS stream (MiB/s, higher is better)', section: 'mux', row: /^throughput, one TLS stream/, ours: /^multiplexer$/, peers: [/haproxy/i] },
  { figure: 'multiplexer 64-byte round trip p50 (µs, lower is better)', section: 'mux', row: /^64-byte round trip p50/, ours: /^multiplexer$/, peers: [/haproxy/i] },
  { figure: 'multiplexer new connections per second (higher is better)', section: 'mux', row: /^new connections per second/, ours: /^multiplexer$/, peers: [/haproxy/i] },
  { figure: 'SSH keystroke round trip p50 (µs, lower is better)', section: 'ssh', row: /^keystroke round trip p50/, ours: /^gateway$/, peers: [/jump|ssh -J/i, /openssh/i] },
];

const peerName = (header: string) => header.replace(/\s*\(peer\)\s*$/, '');

/** One headline row from a section's first table: ours, the preferred peer, and the table's ratio between them (else computed). */
function headlineRow(h: Headline, section: string | undefined): string[] {
  const none = [h.figure, '–', '–', '–'];
  const table = section ? parseFirstTable(section) : undefined;
  const row = table?.rows.find((r) => h.row.test(r[0] ?? ''));
  if (!table || !row) return none;
  const oursCol = table.header.findIndex((c) => h.ours.test(c));
  if (oursCol < 0) return none;
  const peerCol = h.peers.map((re) => table.header.findIndex((c) => !c.includes(' / ') && re.test(c))).find((i) => i > 0 && !NO_FIGURE.test(row[i] ?? '')) ?? -1;
  if (peerCol < 0) return [h.figure, row[oursCol]!, '–', '–'];
  const peer = peerName(table.header[peerCol]!);
  // The table's ratio of ours to this peer: the ratio column whose right side is the longest start of the peer's name.
  const prefix = `${table.header[oursCol]} / `;
  const ratioCol = table.header
    .map((c, i) => ({ c, i }))
    .filter(({ c }) => c.startsWith(prefix) && peer.startsWith(c.slice(prefix.length)))
    .sort((a, b) => b.c.length - a.c.length)[0]?.i;
  const a = cellNumber(row[oursCol]!);
  const b = cellNumber(row[peerCol]!);
  const ratio = ratioCol !== undefined ? row[ratioCol]! : a !== undefined && b ? `${(a / b).toFixed(2)}x` : '–';
  return [h.figure, row[oursCol]!, `${row[peerCol]} (${peer})`, ratio];
}

/** CPU seconds per GiB through the tunnel, from the tunnel section's "CPU seconds per GiB moved" note (totals). */
function cpuRow(section: string | undefined): string[] {
  const figure = 'tunnel CPU seconds per GiB moved, all processes of the path (lower is better)';
  const m = section && /CPU seconds per GiB moved[^\n]*?gateway[^;\n]*\(total ([\d.]+)\);\s*OpenSSH[^;\n]*\(total ([\d.]+)\)/.exec(section);
  if (!m) return [figure, '–', '–', '–'];
  return [figure, m[1]!, `${m[2]} (OpenSSH ssh -R)`, `${(Number(m[1]) / Number(m[2])).toFixed(2)}x`];
}

/** The README's headline table (markdown), from RESULTS.md's text. Paths are relative to the README. */
export function headlineTable(results: string): string {
  const sections = splitSections(results);
  const rows = HEADLINES.map((h) => [...headlineRow(h, sections.get(h.section)), h.section]);
  rows.splice(2, 0, [...cpuRow(sections.get('tunnel')), 'tunnel']);
  // bench:userpath's run is named when RESULTS.md has it (older files do not).
  const dates = ['tunnel', ...(sections.has('userpath') ? ['userpath'] : []), 'mux', 'ssh'].map((s) => `${s} ${/Run (\d{4}-\d\d-\d\d)/.exec(sections.get(s) ?? '')?.[1] ?? '(not run)'}`);
  return [
    '| figure | gateway | peer | gateway / peer | chart |',
    '|---|---|---|---|---|',
    ...rows.map(([figure, ours, peer, ratio, section]) => `| ${figure} | ${ours} | ${peer} | ${ratio} | [${section}](bench/${section}.svg) |`),
    '',
    `From [bench/RESULTS.md](bench/RESULTS.md) (runs: ${dates.join(', ')}), where each figure is measured against its peer in the same run on the machine named there.`,
  ].join('\n');
}

export const HEADLINE_START = '<!-- bench:headline -->';
export const HEADLINE_END = '<!-- /bench:headline -->';

/** readme with the text between the headline markers replaced by the table; throws when the markers are missing. */
export function updateReadme(readme: string, results: string): string {
  const start = readme.indexOf(HEADLINE_START);
  const end = readme.indexOf(HEADLINE_END);
  if (start < 0 || end < start) throw new Error(`README.md has no ${HEADLINE_START} ... ${HEADLINE_END} block`);
  return `${readme.slice(0, start + HEADLINE_START.length)}\n${headlineTable(results)}\n${readme.slice(end)}`;
}

/** --charts: every section's chart (and link) from bench/RESULTS.md, and README.md's headline table. */
export async function renderAll(benchDir: string, readmePath: string): Promise<string[]> {
  const resultsPath = join(benchDir, 'RESULTS.md');
  let results = await readFile(resultsPath, 'utf8');
  const written: string[] = [];
  for (const [name, section] of splitSections(results)) {
    const spec = chartFromMarkdown(name, section);
    if (!spec) continue;
    const linked = withChartLink(name, section);
    if (linked !== section) results = results.replace(section, () => linked);
    await writeFile(join(benchDir, `${name}.svg`), renderChart(spec));
    written.push(`${name}.svg`);
  }
  await writeFile(resultsPath, results);
  await writeFile(readmePath, updateReadme(await readFile(readmePath, 'utf8'), results));
  return written;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  if (!process.argv.includes('--charts')) {
    process.stderr.write('usage: npx tsx bench/record.ts --charts  (redraws bench/*.svg and the README headline table from bench/RESULTS.md)\n');
    process.exit(2);
  }
  const written = await renderAll(BENCH_DIR, join(BENCH_DIR, '..', 'README.md'));
  process.stdout.write(`wrote ${written.map((w) => `bench/${w}`).join(', ')} and the headline table in README.md\n`);
}
