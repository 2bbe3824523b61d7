/**
 * Captures every log line the gateway's code writes in this test process (JSON, at trace level), so a test can
 * check what was logged, and above all what was not: a password, an Authorization header's value.
 */
import { Writable } from 'node:stream';
import { createLogger, setRootLogger } from '../../src/log.js';

/** Sets the root logger to one that appends each JSON line to the returned list. */
export function captureLogs(): string[] {
  const lines: string[] = [];
  setRootLogger(
    createLogger({
      level: 'trace',
      format: 'json',
      destination: new Writable({
        write(chunk, _enc, cb) {
          lines.push(String(chunk));
          cb();
        },
      }),
    }),
  );
  return lines;
}

/** Sets the root logger to one that appends each line, parsed, to the returned list (info and above by default). */
export function captureLogRecords<T = Record<string, unknown>>(level: 'trace' | 'debug' | 'info' = 'info'): T[] {
  const records: T[] = [];
  setRootLogger(createLogger({ level, format: 'json', destination: { write: (l: string) => void records.push(JSON.parse(l) as T) } }));
  return records;
}
