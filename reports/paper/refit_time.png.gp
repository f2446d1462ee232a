set terminal pngcairo size 1200,700 font ',10'
set output 'reports/paper/refit_time.png.tmp.943'
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
set title 'Refit time, delta against the full checkpoint (simulated, 64 receivers)'
set xlabel 'model, change rate'
set ylabel 'refit time (s, log scale)'
set logscale y
set arrow from 7.5, first 150 to 8.5, first 150 nohead lw 2 dt 2 lc rgb 'red' front
set label 'NeMo-DCR: 150 s' at 7.5, first 187.5 left tc rgb 'red' front boxed font ',8'
set arrow from 7.5, first 75 to 8.5, first 75 nohead lw 2 dt 3 lc rgb 'dark-green' front
set label 'target: 75 s' at 7.5, first 93.75 left tc rgb 'dark-green' front boxed font ',8'
set arrow from 7.5, first 5250 to 8.5, first 5250 nohead lw 2 dt 4 lc rgb 'gray30' front
set label '87.5 min full (calibration input)' at 7.5, first 6562.5 left tc rgb 'gray30' front boxed font ',8'
set arrow from 8.5, first 5250 to 9.5, first 5250 nohead lw 2 dt 4 lc rgb 'gray30' front
plot 'reports/paper/refit_time.dat' using 2:xtic(1) title 'full/object_store', 'reports/paper/refit_time.dat' using 3 title 'delta/object_store', 'reports/paper/refit_time.dat' using 4 title 'full/relay_tree', 'reports/paper/refit_time.dat' using 5 title 'delta/relay_tree'
