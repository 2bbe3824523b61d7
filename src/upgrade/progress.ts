/**
 * A download progress bar for a terminal, hand-written (a dozen lines do not need a dependency):
 *
 *   gateway-ent-v17.0.2-linux-amd64-bin.tar.gz [##########··········]  52%  61.3/117.9 MiB
 *
 * Redrawn in place with "\r" at most every 100 ms; on something that is not a terminal it prints one line at
 * the end instead.
 */
export interface Progress {
  update(bytes: number): void;
  done(): void;
}

function mib(n: number): string {
  return (n / (1024 * 1024)).toFixed(1);
}

export function renderBar(label: string, bytes: number, total: number | undefined, width = 20): string {
  if (!total) return `${label} ${mib(bytes)} MiB`;
  const frac = Math.min(1, bytes / total);
  const full = Math.round(frac * width);
  const pct = String(Math.floor(frac * 100)).padStart(3);
  return `${label} [${'#'.repeat(full)}${'·'.repeat(width - full)}] ${pct}%  ${mib(bytes)}/${mib(total)} MiB`;
}

export function progressBar(stream: NodeJS.WritableStream & { isTTY?: boolean }, label: string, total: number | undefined): Progress {
  let last = 0;
  let bytes = 0;
  const tty = stream.isTTY === true;
  return {
    update(n) {
      bytes = n;
      if (!tty) return;
      const now = Date.now();
      if (now - last < 100) return;
      last = now;
      stream.write(`\r${renderBar(label, bytes, total)}`);
    },
    done() {
      stream.write(tty ? `\r${renderBar(label, bytes, total)}\n` : `downloaded ${label} (${mib(bytes)} MiB)\n`);
    },
  };
}
