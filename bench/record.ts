/** Shared by the bench:* scripts: writes one section of bench/RESULTS.md. */
import { readFile, writeFile } from 'node:fs/promises';

/** Replaces (or appends) one "## name" section of bench/RESULTS.md, keeping the others. */
export async function recordSection(name: string, section: string): Promise<void> {
  const path = new URL('./RESULTS.md', import.meta.url);
  let text = '# Benchmark results\n\nEach section is rewritten by its `npm run bench:*` script; figures are from one run on the machine named.\n\n';
  try {
    text = await readFile(path, 'utf8');
  } catch {
    // first run
  }
  const re = new RegExp(`## ${name}\\n[\\s\\S]*?(?=\\n## |$)`);
  text = re.test(text) ? text.replace(re, () => section.trimEnd() + '\n') : `${text.trimEnd()}\n\n${section}`;
  await writeFile(path, text);
}
