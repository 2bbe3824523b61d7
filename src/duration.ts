/** Durations as operators write them: 90s, 30m, 12h, 7d, 2h30m. */
import { GatewayError } from './errors.js';

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

export function parseDuration(text: string, what = 'duration'): number {
  const t = text.trim();
  const parts = [...t.matchAll(/(\d+)(ms|s|m|h|d)/g)];
  if (t === '' || parts.map((p) => p[0]).join('') !== t) {
    throw new GatewayError('GW_ERR_USAGE', `${what}: "${text}" is not a duration`, { hint: 'Write durations like 90s, 30m, 12h, 7d or 2h30m.' });
  }
  return parts.reduce((sum, p) => sum + Number(p[1]) * UNITS[p[2]!]!, 0);
}

export function formatDuration(ms: number): string {
  const units: Array<[string, number]> = [['d', 86_400_000], ['h', 3_600_000], ['m', 60_000], ['s', 1000]];
  let rest = Math.round(ms);
  let out = '';
  for (const [u, size] of units) {
    const n = Math.floor(rest / size);
    if (n > 0) {
      out += `${n}${u}`;
      rest -= n * size;
    }
  }
  return out || '0s';
}
