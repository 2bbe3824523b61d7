/**
 * bench/record.ts: a section's first table becomes an SVG chart (gateway against its peers, per figure), the
 * section gets a link to it, and RESULTS.md's figures become the README's headline table.
 */
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  cellNumber,
  chartFromMarkdown,
  escapeXml,
  headlineTable,
  parseFirstTable,
  recordSectionIn,
  renderAll,
  renderChart,
  seriesColours,
  splitSections,
  updateReadme,
  withChartLink,
} from '../../bench/record.js';

const MUX = `## mux

Run 2026-11-24T17:13:35.489Z with \`npm run bench:mux\`.

| figure | direct | multiplexer | HAProxy (peer) | multiplexer / direct | multiplexer / HAProxy |
|---|---|---|---|---|---|
| throughput, one TLS stream (MiB/s, median of 3) | 1031 | 676 | 710 | 0.66x | 0.95x |
| 64-byte round trip p50 (µs) | 17.8 | 42.5 | 39.0 | 2.39x | 1.09x |
| added round trip p50 over direct (µs) | — | 24.7 | 21.2 | — | 1.16x |
| router CPU per GiB streamed, user + system (ms) | – | 460 (73 + 387) | 373 (27 + 347) | – | 1.23x |
| new connections per second (8 in flight) | 681 | 508 | 641 | 0.75x | 0.79x |

- notes
`;

const SSH = `## ssh

Run 2026-11-25T01:02:03.000Z with \`npm run bench:ssh\`.

| figure | gateway | OpenSSH straight to sshd (peer) | OpenSSH ssh -J via a jump host (peer) | gateway / OpenSSH | gateway / OpenSSH ssh -J |
|---|---|---|---|---|---|
| keystroke round trip p50 (µs) | 480 | 165 | 212 | 2.91x | 2.26x |
| session start (ms) | 706 | 323 | 489 | 2.18x | 1.44x |
`;

const TUNNEL = `## tunnel

Run 2026-11-24T17:13:40.278Z with \`npm run bench:tunnel\`.

| figure | raw TCP | gateway | OpenSSH ssh -R (peer) | gateway / OpenSSH | gateway / raw |
|---|---|---|---|---|---|
| throughput, 1 stream (MiB/s, median of 3) | 1794 | 252 | 444 | 0.57x | 0.14x |
| 64-byte round trip p50 (µs) | 16.0 | 194.2 | 180.7 | 1.07x | 12.17x |
| Proxy memory per idle connected agent at 1000 agents (KiB of VmRSS) | – | 83.5 | – | – | – |

- CPU seconds per GiB moved (single stream, by process): gateway client+sink (bench) 1.27, Proxy daemon 3.05 (total 7.17); OpenSSH client+sink (bench) 0.76, sshd 0.94 (total 3.73); raw TCP client+sink (bench) 0.78.
`;

/** A strict enough well-formedness check: balanced tags, quoted attributes, no raw < or stray & in text or values. */
function checkXml(xml: string): void {
  const stack: string[] = [];
  const entity = /&(amp|lt|gt|quot|apos);/g;
  let pos = 0;
  for (const m of xml.matchAll(/<(\/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>/g)) {
    const between = xml.slice(pos, m.index);
    expect(between.replace(entity, ''), `text before ${m[0]}`).not.toMatch(/[<>&]/);
    expect((m[3] ?? '').replace(entity, ''), `attributes of ${m[0]}`).not.toMatch(/&/);
    if (m[1]) expect(stack.pop()).toBe(m[2]);
    else if (!m[4]) stack.push(m[2]!);
    pos = m.index! + m[0].length;
  }
  expect(xml.slice(pos).trim()).toBe('');
  expect(stack).toEqual([]);
  expect(xml.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
}

const texts = (svg: string) => [...svg.matchAll(/<text [^>]*>([^<]*)<\/text>/g)].map((m) => m[1]!);
const bars = (svg: string) => [...svg.matchAll(/<rect x="16" y="[\d.]+" width="([\d.]+)" height="16" rx="2" fill="(#[0-9a-f]{6})"><title>([^<]*)<\/title>/g)].map((m) => ({ width: Number(m[1]), fill: m[2], title: m[3] }));

describe('bench/record: tables', () => {
  it('reads the first table of a section, and the number of a cell', () => {
    const t = parseFirstTable(MUX)!;
    expect(t.header).toEqual(['figure', 'direct', 'multiplexer', 'HAProxy (peer)', 'multiplexer / direct', 'multiplexer / HAProxy']);
    expect(t.rows).toHaveLength(5);
    expect(t.rows[3]![2]).toBe('460 (73 + 387)');
    expect(parseFirstTable('no table here\n| a |\nnot a separator')).toBeUndefined();
    expect(cellNumber('460 (73 + 387)')).toBe(460);
    expect(cellNumber('p50 0.97 ms')).toBe(0.97);
    expect(cellNumber('–')).toBeUndefined();
    expect(cellNumber('—')).toBeUndefined();
    expect(cellNumber('yes')).toBeUndefined();
  });
});

describe('bench/record: charts', () => {
  it('draws a bar per path and figure, scaled to the figure, with its value, the ratios and a legend', () => {
    const spec = chartFromMarkdown('mux', MUX)!;
    expect(spec.series.map((s) => [s.name, s.kind])).toEqual([
      ['direct', 'baseline'],
      ['multiplexer', 'ours'],
      ['HAProxy (peer)', 'peer'],
    ]);
    // "–" and "—" are no figure: no bar; "460 (73 + 387)" is 460, shown as written.
    const cpu = spec.rows[3]!;
    expect(cpu.bars.map((b) => b.value)).toEqual([undefined, 460, 373]);
    expect(cpu.notes).toEqual(['multiplexer / HAProxy: 1.23x']);
    expect(spec.rows[2]!.bars[0]!.value).toBeUndefined();

    const svg = renderChart(spec);
    checkXml(svg);
    const drawn = bars(svg);
    // 5 figures x 3 paths, less the two without a figure for direct.
    expect(drawn).toHaveLength(13);
    const [baseline, ours, peer] = seriesColours(spec.series);
    expect(new Set([baseline, ours, peer]).size).toBe(3);
    // throughput: 1031 is the row's largest (full length), 676 and 710 in proportion.
    expect(drawn.slice(0, 3).map((b) => b.fill)).toEqual([baseline, ours, peer]);
    expect(drawn[0]!.width).toBe(430);
    expect(drawn[1]!.width).toBeCloseTo((676 / 1031) * 430, 1);
    expect(drawn[1]!.title).toBe('multiplexer: 676');
    const t = texts(svg);
    for (const s of ['bench: mux', 'direct', 'multiplexer', 'HAProxy (peer)', '460 (73 + 387)', '373 (27 + 347)', 'multiplexer / HAProxy: 0.95x', 'multiplexer / direct: 0.66x', '— (direct)', '– (direct)']) {
      expect(t).toContain(s);
    }
    // Deterministic.
    expect(renderChart(chartFromMarkdown('mux', MUX)!)).toBe(svg);
  });

  it('keeps the gateway blue and each peer its own colour, whatever the column order', () => {
    const ssh = renderChart(chartFromMarkdown('ssh', SSH)!);
    const mux = renderChart(chartFromMarkdown('mux', MUX)!);
    checkXml(ssh);
    expect(bars(ssh)[0]!.fill).toBe(bars(mux)[1]!.fill);
    expect(new Set(bars(ssh).slice(0, 3).map((b) => b.fill)).size).toBe(3);
    expect(texts(ssh)).toContain('gateway / OpenSSH ssh -J: 2.26x');
  });

  it('turns a table with a row per path around, and splits cells holding several figures', () => {
    const dial =
      '## dial\n\n| path | connect p50 (ms) | p99 (µs) | throughput (MiB/s) |\n|---|---|---|---|\n| direct TCP | 0.181 | 1133 | 1656 |\n| Dialer via squid | 0.523 | 3312 | 1365 |\n| socat via squid (peer) | 0.983 | 3405 | 703 |\n';
    const spec = chartFromMarkdown('dial', dial)!;
    expect(spec.series.map((s) => s.kind)).toEqual(['baseline', 'ours', 'peer']);
    // "p99" after a p50 column is named after it.
    expect(spec.rows.map((r) => r.label)).toEqual(['connect p50 (ms)', 'connect p99 (µs)', 'throughput (MiB/s)']);
    expect(spec.rows[2]!.bars.map((b) => b.value)).toEqual([1656, 1365, 703]);
    const cluster = '## cluster\n\n| measure | figure |\n|---|---|\n| memory | A 108.4 KiB (5000 agents), B 192.3 KiB (5000) |\n| a note | see above |\n';
    const c = chartFromMarkdown('cluster', cluster)!;
    expect(c.rows).toHaveLength(1); // "see above" has no figure
    expect(c.rows[0]!.bars.map((b) => [b.value, b.text])).toEqual([
      [108.4, 'A 108.4 KiB (5000 agents)'],
      [192.3, 'B 192.3 KiB (5000)'],
    ]);
    checkXml(renderChart(c));
  });

  it('escapes hostile text, bounds the table it reads, and draws nothing for a section without figures', () => {
    const rows = Array.from({ length: 500 }, (_, i) => `| <b>&fig ${i}</b> "x" | ${i + 1} | ${i} ]]> |`).join('\n');
    const hostile = `## x\n\n| figure | gate<way> & co | 'peer' (peer) | a / b |\n|---|---|---|---|\n${rows}\n`;
    const spec = chartFromMarkdown('x', hostile)!;
    expect(spec.rows.length).toBeLessThanOrEqual(40);
    const svg = renderChart(spec);
    checkXml(svg);
    expect(svg).not.toContain('<b>');
    expect(svg).toContain('gate&lt;way&gt; &amp; co');
    expect(svg).toContain('&lt;b&gt;&amp;fig 0&lt;/b&gt; &quot;x&quot;');
    expect(escapeXml(`<&>"'`)).toBe('&lt;&amp;&gt;&quot;&apos;');
    const wide = `## w\n\n| figure | ${Array.from({ length: 50 }, (_, i) => `p${i}`).join(' | ')} |\n|---|\n| f | ${Array.from({ length: 50 }, () => '1').join(' | ')} |\n`;
    expect(chartFromMarkdown('w', wide)!.series.length).toBeLessThanOrEqual(12);
    expect(chartFromMarkdown('n', '## n\n\n| figure | a |\n|---|---|\n| f | – |\n')).toBeUndefined();
    expect(chartFromMarkdown('n', '## n\n\nno table\n')).toBeUndefined();
  });
});

describe('bench/record: RESULTS.md and the README', () => {
  let dir: string | undefined;
  afterEach(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
    dir = undefined;
  });

  it('links the chart right after the heading, once', () => {
    const linked = withChartLink('ssh', SSH);
    expect(linked.split('\n').slice(0, 4)).toEqual(['## ssh', '', '![ssh](ssh.svg)', '']);
    expect(withChartLink('ssh', linked)).toBe(linked);
  });

  it('records a section with its chart and link, replacing the old one and keeping the others', async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-record-'));
    await recordSectionIn(dir, 'mux', MUX);
    await recordSectionIn(dir, 'ssh', SSH);
    await recordSectionIn(dir, 'mux', MUX.replace('| 1031 | 676 |', '| 1000 | 600 |'));
    await recordSectionIn(dir, 'plain', '## plain\n\nno table\n');
    const results = await readFile(join(dir, 'RESULTS.md'), 'utf8');
    expect([...splitSections(results).keys()]).toEqual(['mux', 'ssh', 'plain']);
    expect(results.match(/!\[mux\]\(mux\.svg\)/g)).toHaveLength(1);
    expect(results).toContain('| 1000 | 600 |');
    expect(results).not.toContain('![plain]');
    expect(texts(await readFile(join(dir, 'mux.svg'), 'utf8'))).toContain('600');
    expect(existsSync(join(dir, 'ssh.svg'))).toBe(true);
    expect(existsSync(join(dir, 'plain.svg'))).toBe(false);
  });

  it('names a section by its heading up to a space or a colon, so a titled heading gets name.svg, not name:.svg', () => {
    expect([...splitSections('## tunnel-metrics: the cost of metrics (2026-11-29)\n\ntext\n## issue29: goals\n\nmore\n').keys()]).toEqual(['tunnel-metrics', 'issue29']);
  });

  it("puts bench:userpath's by-hand figures beside bench:tunnel's user path, and names its run", () => {
    const userpath = [
      '## userpath',
      '',
      'Run 2026-11-29T22:00:32.427Z with `npm run bench:userpath`.',
      '',
      '| figure | gateway | gateway classic | OpenSSH ssh -R (peer) | gateway / OpenSSH | gateway classic / OpenSSH |',
      '|---|---|---|---|---|---|',
      '| iperf3 1 stream (Gbit/s, receiver) | 1.97 | 0.50 | 1.89 | 1.04x | 0.26x |',
      '| iperf3 -P 8 (Gbit/s, receiver) | 1.67 | 0.76 | 1.61 | 1.04x | 0.47x |',
      '',
    ].join('\n');
    const table = headlineTable([TUNNEL, userpath, MUX, SSH].join('\n'));
    expect(table.split('\n')).toContain('| user path iperf3, 1 stream, by hand: bench:userpath (Gbit/s, higher is better) | 1.97 | 1.89 (OpenSSH ssh -R) | 1.04x | [userpath](bench/userpath.svg) |');
    expect(table.split('\n')).toContain('| user path iperf3, -P 8, by hand: bench:userpath (Gbit/s, higher is better) | 1.67 | 1.61 (OpenSSH ssh -R) | 1.04x | [userpath](bench/userpath.svg) |');
    expect(table).toContain('runs: tunnel 2026-11-24, userpath 2026-11-29, mux 2026-11-24, ssh 2026-11-25');
  });

  it('builds the headline table from RESULTS.md, preferring ssh -J as the keystroke peer', () => {
    const table = headlineTable([TUNNEL, MUX, SSH].join('\n'));
    const lines = table.split('\n');
    expect(lines).toContain('| tunnel throughput, 1 stream (MiB/s, higher is better) | 252 | 444 (OpenSSH ssh -R) | 0.57x | [tunnel](bench/tunnel.svg) |');
    expect(lines).toContain('| tunnel CPU seconds per GiB moved, all processes of the path (lower is better) | 7.17 | 3.73 (OpenSSH ssh -R) | 1.92x | [tunnel](bench/tunnel.svg) |');
    expect(lines).toContain('| Proxy memory per idle agent (KiB, lower is better) | 83.5 | – | – | [tunnel](bench/tunnel.svg) |');
    expect(lines).toContain('| multiplexer throughput, one TLS stream (MiB/s, higher is better) | 676 | 710 (HAProxy) | 0.95x | [mux](bench/mux.svg) |');
    expect(lines).toContain('| SSH keystroke round trip p50 (µs, lower is better) | 480 | 212 (OpenSSH ssh -J via a jump host) | 2.26x | [ssh](bench/ssh.svg) |');
    expect(table).toContain('runs: tunnel 2026-11-24, mux 2026-11-24, ssh 2026-11-25');
    // Without the jump host column (an older run) the straight OpenSSH figure stands in, named as such.
    const old = SSH.replace(/ \| OpenSSH ssh -J via a jump host \(peer\)/, '').replace(' | gateway / OpenSSH ssh -J |', ' |').replace('| 165 | 212 | 2.91x | 2.26x |', '| 165 | 2.91x |');
    expect(headlineTable(old)).toContain('| 480 | 165 (OpenSSH straight to sshd) | 2.91x |');
    // A section not run yet: dashes, not a failure.
    expect(headlineTable('')).toContain('| tunnel throughput, 1 stream (MiB/s, higher is better) | – | – | – |');
  });

  it('replaces only the text between the README markers, and refuses a README without them', () => {
    const readme = 'intro\n<!-- bench:headline -->\nold\n<!-- /bench:headline -->\nrest\n';
    const out = updateReadme(readme, MUX);
    expect(out.startsWith('intro\n<!-- bench:headline -->\n| figure |')).toBe(true);
    expect(out.endsWith('\n<!-- /bench:headline -->\nrest\n')).toBe(true);
    expect(out).not.toContain('old');
    expect(updateReadme(out, MUX)).toBe(out);
    expect(() => updateReadme('no markers', MUX)).toThrow(/bench:headline/);
  });

  it('--charts redraws every chart from RESULTS.md and refreshes the README, idempotently', async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-record-'));
    await writeFile(join(dir, 'RESULTS.md'), `# Benchmark results\n\nintro\n\n${TUNNEL}\n${MUX}\n${SSH}`);
    await writeFile(join(dir, 'README.md'), 'x\n<!-- bench:headline -->\n<!-- /bench:headline -->\n');
    expect(await renderAll(dir, join(dir, 'README.md'))).toEqual(['tunnel.svg', 'mux.svg', 'ssh.svg']);
    const results = await readFile(join(dir, 'RESULTS.md'), 'utf8');
    const readme = await readFile(join(dir, 'README.md'), 'utf8');
    for (const name of ['tunnel', 'mux', 'ssh']) expect(results).toContain(`## ${name}\n\n![${name}](${name}.svg)\n\nRun `);
    expect(readme).toContain('| 480 | 212 (OpenSSH ssh -J via a jump host) | 2.26x |');
    await renderAll(dir, join(dir, 'README.md'));
    expect(await readFile(join(dir, 'RESULTS.md'), 'utf8')).toBe(results);
    expect(await readFile(join(dir, 'README.md'), 'utf8')).toBe(readme);
  });
});
