// The package's bin entries must be executable after every build (tsc does not set the mode).
import { chmodSync, readFileSync } from 'node:fs';

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
for (const file of Object.values(pkg.bin)) chmodSync(new URL(`../${file}`, import.meta.url), 0o755);
