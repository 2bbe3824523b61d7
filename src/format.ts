/**
 * Sizes and durations as people read them, for the two surfaces that show audit events: `gwctl get events`
 * (src/cli/events.ts: "5.1kB", narrow table columns) and the Web UI's audit page (web/src/lib/audit.ts: "5.1 kB").
 * Pure and without imports, Node's or the DOM's: the page's build (web/tsconfig.json, Vite) compiles this very file.
 */

/** 512B, 5.1kB, 2.0MB, 1.3GB (decimal units); `space` goes between the number and the unit ("5.1 kB"). */
export function formatBytes(n: number, space = ''): string {
  if (n < 1000) return `${n}${space}B`;
  const units = ['kB', 'MB', 'GB', 'TB'];
  let value = n / 1000;
  let unit = 0;
  while (value >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit++;
  }
  return `${value.toFixed(1)}${space}${units[unit]}`;
}

/** 850ms, 12.3s, 4m05s, 2h10m. */
export function formatMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)}s`;
  const s = Math.floor(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}
