set terminal pngcairo size 1200,700 font ',10'
set output 'reports/paper/speedup.png.tmp.943'
set termoption noenhanced
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set key top left
set xtics rotate by -35 scale 0
set grid ytics
set datafile missing 'NaN'
set style textbox opaque noborder
set xrange [-0.6:9.6]
set title 'Speedup of the delta over the full checkpoint on the same transport (simulated)'
set xlabel 'model, change rate'
set ylabel 'full time / delta time (x)'
set yrange [0:*]
plot 'reports/paper/speedup.dat' using 2:xtic(1) title 'object_store', 'reports/paper/speedup.dat' using 3 title 'relay_tree'
